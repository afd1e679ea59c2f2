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
{{- end -}}
