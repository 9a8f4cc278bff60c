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
The wait drain (drainWaiter; docs/zero-downtime.md, "A drain that waits for the provider").
The drain waiter's image: drainWaiter.image, each part defaulting to the manager's.
*/}}
{{- define "resourceconsist.drainWaiterImage" -}}
{{- $own := .Values.drainWaiter.image -}}
{{- $tag := $own.tag | default .Values.image.tag | default .Chart.AppVersion -}}
{{- if eq (toString $tag) "latest" -}}
{{- fail "drainWaiter.image.tag: latest is a moving tag (pods created at different times would run different waiters); set a version, e.g. the chart's appVersion" -}}
{{- end -}}
{{ $own.repository | default .Values.image.repository }}:{{ $tag }}
{{- end }}

{{/*
The drain endpoints the waiters ask, one a line: drainWaiter.endpoints, else the Service in front
of every manager replica (manager/drain.yaml) by its DNS name.
*/}}
{{- define "resourceconsist.drainEndpoints" -}}
{{- if .Values.drainWaiter.endpoints -}}
{{- join "\n" .Values.drainWaiter.endpoints -}}
{{- else -}}
http://{{ include "resourceconsist.manager" . }}-drain.{{ .Release.Namespace }}.svc:{{ .Values.drainWaiter.port }}
{{- end -}}
{{- end }}

{{/*
Whether the manager makes its own webhook certificates (neither cert-manager nor a certificate
you bring, webhook.tls).
*/}}
{{- define "resourceconsist.bootstrapCerts" -}}
{{- if and .Values.webhook.enabled (not .Values.webhook.certManager.enabled) (not .Values.webhook.tls.secretName) }}true{{ end }}
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
The namespaces the webhook is sent pods from, as a namespaceSelector (empty: every namespace):
webhook.namespaceSelector, else, in a namespaced install, the watched namespaces. The webhook
configuration and the drain port's NetworkPolicy rule (the pods the webhook admits) use it.
*/}}
{{- define "resourceconsist.webhookNamespaceSelector" -}}
{{- $watched := include "resourceconsist.watchNamespaces" . }}
{{- if .Values.webhook.namespaceSelector }}
{{- toYaml .Values.webhook.namespaceSelector }}
{{- else if $watched }}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: In
    values: {{ splitList "," $watched | toJson }}
{{- end }}
{{- end }}

{{/*
The manager's ServiceAccount: serviceAccount.name, else resourceconsist-manager.
*/}}
{{- define "resourceconsist.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "resourceconsist.manager" .) }}
{{- end }}

{{/*
The manager's identity, as the API server names it in request.userInfo.username.
*/}}
{{- define "resourceconsist.managerUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "resourceconsist.serviceAccountName" . }}
{{- end }}

{{/*
CEL: field `.field` is the same in `.new` and `.old` (both absent, or equal). For the
least-privilege policy (templates/manager/policy.yaml).
*/}}
{{- define "resourceconsist.celSame" -}}
(has({{ .new }}.{{ .field }}) == has({{ .old }}.{{ .field }}) && (!has({{ .new }}.{{ .field }}) || {{ .new }}.{{ .field }} == {{ .old }}.{{ .field }}))
{{- end }}

{{/*
CEL: two managedFields ownership trees (`fieldsV1`: "f:<field>", "k:<key>", "v:<value>", "."
nested maps) `.a` and `.b` own the same fields but for the paths the manager may write, given by
`.spec` (built in templates/manager/policy.yaml):
  allowed   a CEL predicate on the key "KEY" (the key and everything under it may differ);
  children  key -> spec of that key's subtree, compared the same way;
  each      the spec of every other key's subtree (absent: it must be equal).
A key present on one side only must own only allowed paths. `.depth` names the loop variable of
each level (CEL has no functions of our own, so the comparison is written out level by level).
*/}}
{{- define "resourceconsist.celFieldsSame" -}}
{{- $k := printf "k%d" (int .depth) }}
{{- $allowed := .spec.allowed | default "false" | replace "KEY" $k }}
{{- $same := include "resourceconsist.celFieldsChild" (dict "mode" "same" "a" (printf "%s[%s]" .a $k) "b" (printf "%s[%s]" .b $k) "k" $k "spec" .spec "depth" .depth) }}
{{- $emptyA := include "resourceconsist.celFieldsChild" (dict "mode" "empty" "a" (printf "%s[%s]" .a $k) "k" $k "spec" .spec "depth" .depth) }}
{{- $emptyB := include "resourceconsist.celFieldsChild" (dict "mode" "empty" "a" (printf "%s[%s]" .b $k) "k" $k "spec" .spec "depth" .depth) }}
{{- printf "(%s.all(%s, %s || (%s in %s ? %s : %s)) && %s.all(%s, %s || %s in %s || %s))" .a $k $allowed $k .b $same $emptyA .b $k $allowed $k .a $emptyB }}
{{- end }}

{{/*
CEL: the ownership tree `.a` owns only paths `.spec` allows (see celFieldsSame).
*/}}
{{- define "resourceconsist.celFieldsEmpty" -}}
{{- $k := printf "k%d" (int .depth) }}
{{- $allowed := .spec.allowed | default "false" | replace "KEY" $k }}
{{- .a }}.all({{ $k }}, {{ $allowed }} || {{ include "resourceconsist.celFieldsChild" (dict "mode" "empty" "a" (printf "%s[%s]" .a $k) "k" $k "spec" .spec "depth" .depth) }})
{{- end }}

{{/*
CEL, for celFieldsSame and celFieldsEmpty: the subtree `.a` (and `.b`) under key `.k`, by the
spec of its key (`.mode` same: equal outside allowed paths; empty: owning only allowed paths).
*/}}
{{- define "resourceconsist.celFieldsChild" -}}
{{- $next := add .depth 1 }}
{{- $out := ternary "false" (printf "%s == %s" .a (.b | default "")) (eq .mode "empty") }}
{{- if .spec.each }}
{{- $out = ternary (include "resourceconsist.celFieldsEmpty" (dict "a" .a "spec" .spec.each "depth" $next)) (include "resourceconsist.celFieldsSame" (dict "a" .a "b" .b "spec" .spec.each "depth" $next)) (eq .mode "empty") }}
{{- end }}
{{- range $key, $spec := .spec.children | default dict }}
{{- $child := ternary (include "resourceconsist.celFieldsEmpty" (dict "a" $.a "spec" $spec "depth" $next)) (include "resourceconsist.celFieldsSame" (dict "a" $.a "b" $.b "spec" $spec "depth" $next)) (eq $.mode "empty") }}
{{- $out = printf "(%s == %s ? %s : %s)" $.k (squote $key) $child $out }}
{{- end }}
{{- $out }}
{{- end }}

{{/*
Annotation keys the adapters of this install record on their employers (Services) beyond the
frame's: the built-in ones' (the demo adapter's last error, experimental/demo.py)
and leastPrivilegePolicy.serviceAnnotations for adapters of your own. A JSON list.
*/}}
{{- define "resourceconsist.employerAnnotations" -}}
{{- $keys := list }}
{{- if has "demo" .Values.adapters }}
{{- $keys = append $keys "resource-consist.kusionstack.io/demo-condition" }}
{{- end }}
{{- concat $keys (.Values.leastPrivilegePolicy.serviceAnnotations | default list) | uniq | toJson }}
{{- end }}

{{/*
CEL list: the metadata fields the least-privilege policy has a rule of its own for, or leaves to
the API server (resourceVersion, generation).
*/}}
{{- define "resourceconsist.ruledMetadata" -}}
['labels', 'annotations', 'finalizers', 'ownerReferences', 'managedFields', 'resourceVersion', 'generation']
{{- end }}

{{/*
Sharding's employer label on pods (resourceconsist/wire.py EMPLOYER_LABEL; docs/scaling.md, "Pods
selected by the API server"), and its value for a pod every shard watches (EMPLOYER_LABEL_SHARED).
*/}}
{{- define "resourceconsist.employerLabel" -}}resource-consist.kusionstack.io/employer{{- end }}
{{- define "resourceconsist.employerLabelShared" -}}Shared{{- end }}

{{/*
The ownership paths (celFieldsSame's spec, JSON) the manager may take from others, or give up,
on pods and Services: the ones it may write.
*/}}
{{- define "resourceconsist.workloadOwnership" -}}
{{- $finalizers := list "resource-consist.kusionstack.io/clean-" "prot.podopslifecycle.kusionstack.io/" "guard.resource-consist.kusionstack.io/" }}
{{- $finalizerTests := list }}
{{- range $finalizers }}
{{- $finalizerTests = append $finalizerTests (printf "KEY.startsWith('v:\"%s')" .) }}
{{- end }}
{{- $metadata := dict
  "f:annotations" (dict "allowed" "KEY == '.' || KEY in variables.ourAnnotations.map(a, 'f:' + a)")
  "f:finalizers" (dict "allowed" (printf "KEY == '.' || %s" (join " || " $finalizerTests)))
  "f:labels" (dict "allowed" (printf "KEY == '.' || (request.resource.resource == 'services' && (KEY.startsWith('f:shard.alpha.sharding.timebertt.dev/') || KEY.startsWith('f:drain.alpha.sharding.timebertt.dev/'))) || (variables.employerWritable && KEY == 'f:%s')" (include "resourceconsist.employerLabel" .))) }}
{{- $status := dict "f:conditions" (dict "allowed" "KEY == '.' || KEY.startsWith('k:{\"type\":\"readiness.resource-consist.kusionstack.io/')") }}
{{- dict "children" (dict "f:metadata" (dict "children" $metadata) "f:status" (dict "children" $status)) | toJson }}
{{- end }}

{{/*
The same for the webhook configurations: each entry's caBundle.
*/}}
{{- define "resourceconsist.webhookOwnership" -}}
{{- $entry := dict "children" (dict "f:clientConfig" (dict "allowed" "KEY == 'f:caBundle'")) }}
{{- dict "children" (dict "f:webhooks" (dict "each" $entry)) | toJson }}
{{- end }}
