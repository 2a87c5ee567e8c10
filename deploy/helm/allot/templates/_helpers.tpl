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

{{/* The policy source flags every component shares (--store PATH or URL, or nothing: ALLOT_STORE comes from a Secret). */}}
{{- define "allot.policyFlags" -}}
{{- $f := dict -}}
{{- if ne .Values.policies.source "store" -}}
{{- $_ := set $f "store" "/etc/allot/policies/policies.yaml" -}}
{{- else if and .Values.policies.store.url (not .Values.policies.store.existingSecret) -}}
{{- $_ := set $f "store" .Values.policies.store.url -}}
{{- end -}}
{{- toYaml $f -}}
{{- end -}}

{{/*
The one Secret of client TLS files (ca.crt, and tls.crt/tls.key with a
client certificate) both binaries use towards Redis and NATS
(--client-tls-*): redis.tls.secretName or nats.tlsSecret, which must then
be the same Secret.
*/}}
{{- define "allot.clientTLSSecret" -}}
{{- $v := .Values -}}
{{- $r := "" -}}
{{- if $v.redis.tls.enabled -}}{{- $r = $v.redis.tls.secretName | default "" -}}{{- end -}}
{{- $n := $v.nats.tlsSecret | default "" -}}
{{- if and $r $n (ne $r $n) -}}
{{- fail (printf "redis.tls.secretName %q and nats.tlsSecret %q differ: one set of client TLS files (--client-tls-*) serves Redis and NATS; give both the same Secret" $r $n) -}}
{{- end -}}
{{- if $r -}}{{ $r }}{{- else -}}{{ $n }}{{- end -}}
{{- end -}}

{{/* The --redis value without a password: plain addresses, or a rediss:// URL for TLS. */}}
{{- define "allot.redisURL" -}}
{{- $r := .Values.redis -}}
{{- $addrs := join "," $r.addresses -}}
{{- if $r.password.existingSecret -}}
{{- printf "%s://%s:$(REDIS_PASSWORD)@%s" (ternary "rediss" "redis" $r.tls.enabled) $r.username $addrs -}}
{{- else if $r.tls.enabled -}}
{{- printf "rediss://%s" $addrs -}}
{{- else -}}
{{- $addrs -}}
{{- end -}}
{{- end -}}

{{/* Transport flags both binaries share: TLS listeners, Redis, NATS credentials, client TLS. Pass (dict "ctx" $ "listener" true). */}}
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
{{- /* With a password the URL is ALLOT_REDIS (allot.secretEnv), never an argument. */ -}}
{{- if and $v.redis.addresses (not $v.redis.password.existingSecret) -}}
{{- $_ := set $f "redis" (include "allot.redisURL" .ctx) -}}
{{- end -}}
{{- if include "allot.clientTLSSecret" .ctx -}}
{{- $_ := set $f "client-tls-ca" "/etc/allot/client-tls/ca.crt" -}}
{{- if or $v.redis.tls.clientCert $v.nats.clientCert -}}
{{- $_ := set $f "client-tls-cert" "/etc/allot/client-tls/tls.crt" -}}
{{- $_ := set $f "client-tls-key" "/etc/allot/client-tls/tls.key" -}}
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
{{- $_ := set $f "log-level" $v.logLevel -}}
{{- toYaml $f -}}
{{- end -}}

{{/*
Environment both binaries share: secrets as ALLOT_* variables, never
args. A Redis password is REDIS_PASSWORD, expanded by the kubelet into
the ALLOT_REDIS URL defined after it (so it must be URL-safe, or
percent-encoded in the Secret); traces go to OTEL_EXPORTER_OTLP_ENDPOINT.
*/}}
{{- define "allot.secretEnv" -}}
{{- $v := .Values -}}
{{- if and $v.redis.addresses $v.redis.password.existingSecret }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $v.redis.password.existingSecret }}
      key: {{ $v.redis.password.key }}
- name: ALLOT_REDIS
  value: {{ include "allot.redisURL" . | quote }}
{{- end }}
{{- if and (eq $v.policies.source "store") $v.policies.store.existingSecret }}
- name: ALLOT_STORE
  valueFrom:
    secretKeyRef:
      name: {{ $v.policies.store.existingSecret }}
      key: {{ $v.policies.store.key }}
{{- end }}
{{- with $v.otlp.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* Values that became settings of the policy file: refuse them rather than ignore them. */}}
{{- define "allot.removedValues" -}}
{{- $v := .Values -}}
{{- range $k, $x := ($v.node.lease | default dict) }}{{ if $x }}{{ fail (printf "node.lease.%s: the lease knobs are the policy file's lease: block now (docs/policies.md)" $k) }}{{ end }}{{ end }}
{{- range $k, $x := ($v.coordinator.rebalance | default dict) }}{{ if $x }}{{ fail (printf "coordinator.rebalance.%s: the rebalance knobs are the policy file's rebalance: block now (docs/multi-region.md)" $k) }}{{ end }}{{ end }}
{{- if $v.multiRegion.demandPeriod }}{{ fail "multiRegion.demandPeriod: nodes publish demand every second (fixed, ARCHITECTURE.md)" }}{{ end }}
{{- if $v.node.shutdownTimeoutSeconds }}{{ fail "node.shutdownTimeoutSeconds: calls in flight get 10s after the drain (fixed, ARCHITECTURE.md)" }}{{ end }}
{{- if $v.node.gossip.floor }}{{ fail "node.gossip.floor: fixed at 2 (ARCHITECTURE.md)" }}{{ end }}
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
{{- with include "allot.clientTLSSecret" . }}
- name: client-tls
  secret:
    secretName: {{ . }}
{{- end }}
{{- if $v.nats.credsSecret }}
- name: nats-creds
  secret:
    secretName: {{ $v.nats.credsSecret }}
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
{{- if include "allot.clientTLSSecret" . }}
- name: client-tls
  mountPath: /etc/allot/client-tls
  readOnly: true
{{- end }}
{{- if $v.nats.credsSecret }}
- name: nats-creds
  mountPath: /etc/allot/nats
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
