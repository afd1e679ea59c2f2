// Command kube is a multi-call binary bundling the Kubernetes components the
// test cluster needs: kube-apiserver, kube-controller-manager, kube-scheduler,
// kubelet, kube-proxy and kubectl. The component is chosen from argv[0]
// (e.g. a symlink named "kubectl") or from the first argument
// ("kube kubectl get nodes").
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	_ "time/tzdata" // for CronJob time zone support

	"github.com/spf13/cobra"
	_ "k8s.io/client-go/plugin/pkg/client/auth"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var servers = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
	"kube-proxy":              proxy.NewProxyCommand,
}

func usage() {
	names := []string{"kubectl"}
	for n := range servers {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: kube COMPONENT [args...] (or call through a symlink named COMPONENT)\ncomponents: %v\n", names)
	os.Exit(2)
}

func runKubectl() {
	logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) // nolint:errcheck
	command := kubectlcmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err)
	}
	os.Exit(0)
}

func main() {
	name := filepath.Base(os.Args[0])
	if name == "kube" || (name != "kubectl" && servers[name] == nil) {
		if len(os.Args) < 2 {
			usage()
		}
		name = os.Args[1]
		// Drop the subcommand so each component sees its own argv.
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	if name == "kubectl" {
		runKubectl()
	}
	newCmd, ok := servers[name]
	if !ok {
		usage()
	}
	os.Exit(cli.Run(newCmd()))
}
