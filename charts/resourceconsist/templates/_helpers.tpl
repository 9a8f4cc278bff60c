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
The selector of a role's pods (the role as the context: "" or "manager", or "webhook"). The
manager's is selectorLabels in every mode, so that moving an install into or out of sharding never
changes its Deployment's immutable selector; the sharded webhook Deployment's pods carry
`control-plane: resourceconsist-webhook` instead, so neither Deployment ever selects the other's.
*/}}
{{- define "resourceconsist.roleSelector" -}}
{{- if eq . "webhook" -}}
control-plane: resourceconsist-webhook
{{- else -}}
control-plane: resourceconsist-manager
{{- end }}
{{- end }}

{{/*
The selector a role's Deployment has (context: dict "root" $ "role" <role>): the one it already
has in the cluster when it exists (a Deployment's selector is immutable: an install made by an
earlier chart keeps its own, e.g. a sharded install's `app.kubernetes.io/component`), else
roleSelector. Its pods carry it (podLabels), and the webhook Service and the disruption budgets
select with it.
*/}}
{{- define "resourceconsist.podSelector" -}}
{{- $name := ternary "resourceconsist-webhook" (include "resourceconsist.manager" .root) (eq .role "webhook") }}
{{- $existing := lookup "apps/v1" "Deployment" .root.Release.Namespace $name }}
{{- toYaml (dig "spec" "selector" "matchLabels" (include "resourceconsist.roleSelector" .role | fromYaml) $existing) }}
{{- end }}

{{/*
The labels of a role's pods beyond the common ones (context as podSelector): its selector, its
role's, and its component.
*/}}
{{- define "resourceconsist.podLabels" -}}
{{- $labels := include "resourceconsist.podSelector" . | fromYaml }}
{{- $labels = merge $labels (include "resourceconsist.roleSelector" .role | fromYaml) }}
{{- with .role }}{{ $_ := set $labels "app.kubernetes.io/component" . }}{{ end }}
{{- toYaml $labels }}
{{- end }}

{{/*
Whether an adapter that reads the provider's credentials runs (the credentials Secret, RRSA).
*/}}
{{- define "resourceconsist.needsCredentials" -}}
{{- if has "alibabacloudslb" .Values.adapters }}true{{ end }}
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
