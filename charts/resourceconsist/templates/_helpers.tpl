{{/*
Names the code relies on (docs/wire-contract.md): fixed, whatever the release is called.
*/}}
{{- define "resourceconsist.manager" -}}resourceconsist-manager{{- end }}

{{/*
Labels on every object.
*/}}
{{- define "resourceconsist.labels" -}}
app.kubernetes.io/name: resourceconsist
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: resourceconsist
{{- with .Values.additionalLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The manager pods' selector: the label config/ has always used, so that the Deployment's
(immutable) selector is the same whichever way it was installed.
*/}}
{{- define "resourceconsist.selectorLabels" -}}
control-plane: resourceconsist-manager
{{- end }}

{{/*
The image: the tag defaults to the chart's appVersion, the package version.
*/}}
{{- define "resourceconsist.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if eq (toString $tag) "latest" -}}
{{- fail "image.tag: latest is a moving tag (two replicas could run different code behind one Lease); set a version, e.g. the chart's appVersion" -}}
{{- end -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end }}

{{/*
Whether the manager makes its own webhook certificates (no cert-manager).
*/}}
{{- define "resourceconsist.bootstrapCerts" -}}
{{- if and .Values.webhook.enabled (not .Values.webhook.certManager.enabled) }}true{{ end }}
{{- end }}

{{/*
The namespaces the manager watches, comma-separated (empty: all): watchNamespaces, and
watchNamespace (the one-namespace value of earlier charts), each once, sorted.
*/}}
{{- define "resourceconsist.watchNamespaces" -}}
{{- $names := concat (.Values.watchNamespaces | default list) (compact (list .Values.watchNamespace)) }}
{{- join "," (sortAlpha (uniq $names)) }}
{{- end }}

{{/*
The manager's identity, as the API server names it in request.userInfo.username.
*/}}
{{- define "resourceconsist.managerUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "resourceconsist.manager" . }}
{{- end }}

{{/*
CEL: field `.field` is the same in `.new` and `.old` (both absent, or equal). For the
least-privilege policy (templates/manager/policy.yaml).
*/}}
{{- define "resourceconsist.celSame" -}}
(has({{ .new }}.{{ .field }}) == has({{ .old }}.{{ .field }}) && (!has({{ .new }}.{{ .field }}) || {{ .new }}.{{ .field }} == {{ .old }}.{{ .field }}))
{{- end }}
