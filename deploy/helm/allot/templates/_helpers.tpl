{{/* Names. */}}
{{- define "allot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "allot.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels; pass (dict "ctx" $ "component" "node"). */}}
{{- define "allot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "allot.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "allot.labels" -}}
{{ include "allot.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- with .ctx.Values.multiRegion.region }}
allot.dev/region: {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "allot.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "allot.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "allot.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
allot.args renders a flag map as container args, one "--name=value" per
key in name order. Empty strings and nulls are left out (the binary's
default applies); booleans and numbers are printed as Go's flag package
parses them. Pass the map.
*/}}
{{- define "allot.args" -}}
{{- range $k := keys . | sortAlpha }}
{{- $v := index $ $k }}
{{- if not (or (kindIs "invalid" $v) (and (kindIs "string" $v) (eq $v ""))) }}
{{- if kindIs "float64" $v }}
{{- if eq $v (floor $v) }}{{ $v = int64 $v }}{{ end }}
{{- end }}
- {{ printf "--%s=%v" $k $v | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The policy source flags every component shares (--policies or nothing: --store comes from env). */}}
{{- define "allot.policyFlags" -}}
{{- $f := dict -}}
{{- if ne .Values.policies.source "store" -}}
{{- $_ := set $f "policies" "/etc/allot/policies/policies.yaml" -}}
{{- else if and .Values.policies.store.url (not .Values.policies.store.existingSecret) -}}
{{- $_ := set $f "store" .Values.policies.store.url -}}
{{- end -}}
{{- toYaml $f -}}
{{- end -}}

{{/* Transport flags both binaries share: TLS listeners, Redis and NATS credentials and TLS. Pass (dict "ctx" $ "listener" true). */}}
{{- define "allot.transportFlags" -}}
{{- $v := .ctx.Values -}}
{{- $f := dict -}}
{{- if $v.tls.enabled -}}
{{- $_ := set $f "tls-cert" "/etc/allot/tls/tls.crt" -}}
{{- $_ := set $f "tls-key" "/etc/allot/tls/tls.key" -}}
{{- if $v.tls.clientAuth -}}
{{- $_ := set $f "tls-client-ca" "/etc/allot/tls/ca.crt" -}}
{{- end -}}
{{- end -}}
{{- if $v.redis.addresses -}}
{{- $_ := set $f "redis" (join "," $v.redis.addresses) -}}
{{- end -}}
{{- $_ := set $f "redis-username" $v.redis.username -}}
{{- if $v.redis.tls.enabled -}}
{{- $_ := set $f "redis-tls" true -}}
{{- if $v.redis.tls.secretName -}}
{{- $_ := set $f "redis-tls-ca" "/etc/allot/redis-tls/ca.crt" -}}
{{- if $v.redis.tls.clientCert -}}
{{- $_ := set $f "redis-tls-cert" "/etc/allot/redis-tls/tls.crt" -}}
{{- $_ := set $f "redis-tls-key" "/etc/allot/redis-tls/tls.key" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* The node refuses --nats and --regions without --region. */ -}}
{{- if $v.multiRegion.region -}}
{{- $_ := set $f "region" $v.multiRegion.region -}}
{{- $_ := set $f "regions" (join "," $v.multiRegion.regions) -}}
{{- $_ := set $f "nats" $v.nats.url -}}
{{- end -}}
{{- if $v.nats.credsSecret -}}
{{- $_ := set $f "nats-creds" (printf "/etc/allot/nats/%s" $v.nats.credsKey) -}}
{{- end -}}
{{- if $v.nats.tlsSecret -}}
{{- $_ := set $f "nats-tls-ca" "/etc/allot/nats-tls/ca.crt" -}}
{{- if $v.nats.clientCert -}}
{{- $_ := set $f "nats-tls-cert" "/etc/allot/nats-tls/tls.crt" -}}
{{- $_ := set $f "nats-tls-key" "/etc/allot/nats-tls/tls.key" -}}
{{- end -}}
{{- end -}}
{{- $_ := set $f "log-level" $v.logLevel -}}
{{- $_ := set $f "otlp-endpoint" $v.otlp.endpoint -}}
{{- toYaml $f -}}
{{- end -}}

{{/* Environment both binaries share: secrets as ALLOT_* variables, never args. */}}
{{- define "allot.secretEnv" -}}
{{- $v := .Values -}}
{{- if $v.redis.password.existingSecret }}
- name: ALLOT_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $v.redis.password.existingSecret }}
      key: {{ $v.redis.password.key }}
{{- end }}
{{- if and (eq $v.policies.source "store") $v.policies.store.existingSecret }}
- name: ALLOT_STORE
  valueFrom:
    secretKeyRef:
      name: {{ $v.policies.store.existingSecret }}
      key: {{ $v.policies.store.key }}
{{- end }}
{{- end -}}

{{/* GOMEMLIMIT from the container's memory limit. Pass (dict "on" bool "container" name). */}}
{{- define "allot.goMemLimit" -}}
{{- if .on }}
- name: GOMEMLIMIT
  valueFrom:
    resourceFieldRef:
      containerName: {{ .container }}
      resource: limits.memory
{{- end }}
{{- end -}}

{{/* Volumes both components mount, and their mounts. */}}
{{- define "allot.volumes" -}}
{{- $v := .Values -}}
{{- if ne $v.policies.source "store" }}
- name: policies
  configMap:
    name: {{ if eq $v.policies.source "existingConfigMap" }}{{ required "policies.existingConfigMap is required with policies.source=existingConfigMap" $v.policies.existingConfigMap }}{{ else }}{{ include "allot.fullname" . }}-policies{{ end }}
{{- end }}
{{- if $v.tls.enabled }}
- name: tls
  secret:
    secretName: {{ required "tls.secretName is required with tls.enabled" $v.tls.secretName }}
{{- end }}
{{- if and $v.redis.tls.enabled $v.redis.tls.secretName }}
- name: redis-tls
  secret:
    secretName: {{ $v.redis.tls.secretName }}
{{- end }}
{{- if $v.nats.credsSecret }}
- name: nats-creds
  secret:
    secretName: {{ $v.nats.credsSecret }}
{{- end }}
{{- if $v.nats.tlsSecret }}
- name: nats-tls
  secret:
    secretName: {{ $v.nats.tlsSecret }}
{{- end }}
{{- end -}}

{{- define "allot.volumeMounts" -}}
{{- $v := .Values -}}
{{- if ne $v.policies.source "store" }}
# The directory, not a subPath: the kubelet swaps the ConfigMap's files
# atomically there, and the node's watcher sees the new policy file.
- name: policies
  mountPath: /etc/allot/policies
  readOnly: true
{{- end }}
{{- if $v.tls.enabled }}
- name: tls
  mountPath: /etc/allot/tls
  readOnly: true
{{- end }}
{{- if and $v.redis.tls.enabled $v.redis.tls.secretName }}
- name: redis-tls
  mountPath: /etc/allot/redis-tls
  readOnly: true
{{- end }}
{{- if $v.nats.credsSecret }}
- name: nats-creds
  mountPath: /etc/allot/nats
  readOnly: true
{{- end }}
{{- if $v.nats.tlsSecret }}
- name: nats-tls
  mountPath: /etc/allot/nats-tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* Pod anti-affinity. Pass (dict "ctx" $ "component" "node" "mode" "soft" "key" "kubernetes.io/hostname"). */}}
{{- define "allot.affinity" -}}
{{- if eq .mode "hard" }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: {{ .key }}
        labelSelector:
          matchLabels:
            {{- include "allot.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 12 }}
{{- else if eq .mode "soft" }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: {{ .key }}
          labelSelector:
            matchLabels:
              {{- include "allot.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 14 }}
{{- else if ne .mode "none" }}
{{- fail (printf "antiAffinity %q: want soft, hard or none" .mode) }}
{{- end }}
{{- end -}}
