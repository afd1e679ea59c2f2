{{/*
Object names are the kustomize base's, not prefixed with the release name:
the server, its Role and its Secret are found by these names
(docs/deploy.md). One release per pair of namespaces.
*/}}
{{- define "mcp.name" -}}mcp-k8s-ephemeral-job{{- end -}}

{{/* The label every object of the base carries, plus Helm's own. */}}
{{- define "mcp.labels" -}}
app.kubernetes.io/part-of: mcp-k8s-ephemeral-job
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* The server pod's selector (the Deployment's, the Service's, its NetworkPolicy's). */}}
{{- define "mcp.serverSelector" -}}
app.kubernetes.io/name: mcp-k8s-ephemeral-job
app.kubernetes.io/component: server
{{- end -}}

{{- define "mcp.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Refuses values that would break the security model before anything is applied. */}}
{{- define "mcp.check" -}}
{{- if eq .Values.namespaces.server .Values.namespaces.jobs -}}
{{- fail "namespaces.server and namespaces.jobs must differ: job pods must never share a namespace with the server's token Secret and ServiceAccount" -}}
{{- end -}}
{{- if and .Values.auth.create (not .Values.auth.token) -}}
{{- fail "auth.create is true but auth.token is empty: set --set auth.token=... or create the Secret yourself and leave auth.create false" -}}
{{- end -}}
{{- /*
Without its token Secret the server's pod never starts
(CreateContainerConfigError) while Helm reports the release deployed, so a
missing Secret fails the install instead: it must be named, and when the
server's namespace exists already (Helm's `lookup`; nothing under `helm
template`), it must exist there with its key.
*/ -}}
{{- if not .Values.auth.create -}}
{{- $create := printf "kubectl -n %s create secret generic mcp-k8s-ephemeral-job-auth --from-literal=%s=\"$(head -c 32 /dev/urandom | base64 | tr -d '/+=')\"" .Values.namespaces.server .Values.auth.secretKey -}}
{{- if not .Values.auth.secretName -}}
{{- fail (printf "auth.secretName is required: the server reads its token from a Secret in namespace %s. Create one (%s) and set auth.secretName=mcp-k8s-ephemeral-job-auth, or let the chart create it with auth.create=true and auth.token=..." .Values.namespaces.server $create) -}}
{{- end -}}
{{- if lookup "v1" "Namespace" "" .Values.namespaces.server -}}
{{- $secret := lookup "v1" "Secret" .Values.namespaces.server .Values.auth.secretName -}}
{{- if not $secret -}}
{{- fail (printf "the token Secret %s/%s (auth.secretName) does not exist: create it first (%s), or set auth.create=true and auth.token=..." .Values.namespaces.server .Values.auth.secretName $create) -}}
{{- end -}}
{{- if not (hasKey (default dict $secret.data) .Values.auth.secretKey) -}}
{{- fail (printf "the token Secret %s/%s has no key %s (auth.secretKey)" .Values.namespaces.server .Values.auth.secretName .Values.auth.secretKey) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The token Secret's name: auth.secretName, or the base's when the chart creates it. */}}
{{- define "mcp.authSecretName" -}}
{{- if .Values.auth.create -}}
{{ .Values.auth.secretName | default "mcp-k8s-ephemeral-job-auth" }}
{{- else -}}
{{ .Values.auth.secretName }}
{{- end -}}
{{- end -}}

{{/*
The server's settings, shared by its Deployment and the doctor test pod
(templates/tests/doctor.yaml), so doctor checks what the server runs with.
*/}}
{{- define "mcp.serverEnv" -}}
- name: MCP_K8S_TRANSPORT
  value: http
- name: MCP_K8S_ADDR
  value: ":8080"
- name: MCP_K8S_PROBE_ADDR
  value: ":8081"
- name: MCP_K8S_NAMESPACE
  value: {{ .Values.namespaces.jobs }}
- name: MCP_K8S_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "mcp.authSecretName" . }}
      key: {{ .Values.auth.secretKey }}
- name: MCP_K8S_RUNNER_IMAGE
  value: {{ .Values.runnerImage | default (include "mcp.image" .) }}
- name: MCP_K8S_ALLOWED_IMAGES
  value: {{ join "," .Values.allowedImages | quote }}
{{- if .Values.podTemplate }}
- name: MCP_K8S_POD_TEMPLATE
  value: {{ .Values.podTemplatePath }}
{{- end }}
- name: MCP_K8S_MAX_SANDBOXES
  value: {{ .Values.sandboxes.maxOpen | int | quote }}
{{- if .Values.outputs.existingClaim }}
- name: MCP_K8S_OUTPUTS_DIR
  value: {{ .Values.outputs.mountPath }}
- name: MCP_K8S_OUTPUTS_MAX_RUN_BYTES
  value: {{ .Values.outputs.maxRunBytes | int64 | quote }}
- name: MCP_K8S_OUTPUTS_MAX_BYTES
  value: {{ .Values.outputs.maxBytes | int64 | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end -}}

{{/* The server container's mounts and its pod's volumes (the doctor pod's too): the key and its list, or nothing. */}}
{{- define "mcp.serverVolumeMounts" -}}
{{- if or .Values.podTemplate .Values.outputs.existingClaim -}}
volumeMounts:
  {{- if .Values.podTemplate }}
  - name: pod-template
    mountPath: {{ dir .Values.podTemplatePath }}
    readOnly: true
  {{- end }}
  {{- if .Values.outputs.existingClaim }}
  - name: outputs
    mountPath: {{ .Values.outputs.mountPath }}
  {{- end }}
{{- end }}
{{- end -}}

{{- define "mcp.serverVolumes" -}}
{{- if or .Values.podTemplate .Values.outputs.existingClaim -}}
volumes:
  {{- if .Values.podTemplate }}
  - name: pod-template
    configMap:
      name: {{ include "mcp.name" . }}-pod-template
  {{- end }}
  {{- if .Values.outputs.existingClaim }}
  - name: outputs
    persistentVolumeClaim:
      claimName: {{ .Values.outputs.existingClaim }}
  {{- end }}
{{- end }}
{{- end -}}
