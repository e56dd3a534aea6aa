{{/* Names and labels. */}}
{{- define "hermes.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "hermes.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: include with (dict "root" $ "component" "dispatcher"). */}}
{{- define "hermes.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "hermes.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The JetStream consumer a pool's agents share for one task type (topology: pool_<type, . as _>). */}}
{{- define "hermes.poolConsumer" -}}
{{- printf "pool_%s" (replace "." "_" .) -}}
{{- end -}}

{{- define "hermes.natsMonitoring" -}}
{{- if .Values.nats.enabled -}}
{{- default (printf "%s-nats-headless.%s.svc:8222" .Release.Name .Release.Namespace) .Values.nats.monitoringEndpoint -}}
{{- else -}}
{{- .Values.externalNats.monitoringEndpoint -}}
{{- end -}}
{{- end -}}

{{/*
The NATS user one Deployment connects as, as JSON (read it with `include ... | fromJson`):
include with (dict "root" $ "user" "dispatcher") for a service, or (dict "root" $ "user" "agent"
"override" $pool.nats) for an executor pool. Each service has its own entry under
externalNats.users; a pool uses its own `nats` when that names a Secret, and the `agent` user's
otherwise (the whole entry, never a mix of the two). With the bundled NATS chart nothing is taken
from externalNats (validate.yaml refuses Secrets there): each service's URL is `<user>-url` of the
Secret nats-auth.yaml makes, every pool the agent user's.
*/}}
{{- define "hermes.natsUser" -}}
{{- $root := .root -}}
{{- $blank := dict "urlSecret" (dict "name" "" "key" "url") "credentialsSecret" (dict "name" "" "key" "nats.creds") "inboxPrefix" "" -}}
{{- $entry := $blank -}}
{{- if not $root.Values.nats.enabled -}}
{{- $users := $root.Values.externalNats.users | default dict -}}
{{- $entry = mergeOverwrite (deepCopy $blank) (get $users .user | default dict) -}}
{{- with .override -}}
{{- if or (and .urlSecret .urlSecret.name) (and .credentialsSecret .credentialsSecret.name) -}}
{{- $entry = mergeOverwrite (deepCopy $blank) . -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $root.Values.nats.enabled -}}
{{- $_ := set $entry "urlSecret" (dict "name" (printf "%s-nats-hermes" $root.Release.Name) "key" (printf "%s-url" .user)) -}}
{{- end -}}
{{- $_ := set $entry "user" .user -}}
{{- toJson $entry -}}
{{- end -}}

{{/* Whether a NATS user entry (from hermes.natsUser) names a Secret: "true" or "". */}}
{{- define "hermes.natsAuthenticated" -}}
{{- if or .urlSecret.name .credentialsSecret.name }}true{{ end -}}
{{- end -}}

{{/*
Environment every Hermes container shares: NATS, logs, traces. Include with
(dict "root" $ "nats" <entry from hermes.natsUser>): the Deployment's own NATS user.
*/}}
{{- define "hermes.commonEnv" -}}
{{- $root := .root -}}
{{- $nats := .nats -}}
{{- if $nats.url }}
- name: HERMES_NATS_URL
  value: {{ $nats.url | quote }}
{{- else if $nats.urlSecret.name }}
- name: HERMES_NATS_URL
  valueFrom:
    secretKeyRef:
      name: {{ $nats.urlSecret.name }}
      key: {{ $nats.urlSecret.key }}
{{- else if $root.Values.nats.enabled }}
- name: HERMES_NATS_URL
  value: {{ default (printf "nats://%s-nats:4222" $root.Release.Name) $root.Values.nats.url | quote }}
{{- else }}
- name: HERMES_NATS_URL
  value: {{ $root.Values.externalNats.url | quote }}
{{- end }}
- name: HERMES_NATS_REPLICAS
  value: {{ $root.Values.streamReplicas | quote }}
{{- if $nats.credentialsSecret.name }}
- name: HERMES_NATS_CREDS
  value: /etc/hermes/nats/{{ $nats.credentialsSecret.key }}
{{- end }}
{{- /* Hermes takes the reply prefix from the URL's user; a credentials file names none the
       service can read, so the prefix is set for it, to the one its user's permissions allow. */}}
{{- if $nats.inboxPrefix }}
- name: HERMES_NATS_INBOX_PREFIX
  value: {{ $nats.inboxPrefix | quote }}
{{- else if $nats.credentialsSecret.name }}
- name: HERMES_NATS_INBOX_PREFIX
  value: {{ printf "_INBOX_%s" $nats.user | quote }}
{{- end }}
{{- /* TLS to NATS (natsTls): the CA, and the client certificate for mTLS, under /etc/hermes/nats-tls. */}}
{{- with $root.Values.natsTls.secretName }}
- name: HERMES_NATS_TLS_CA_FILE
  value: /etc/hermes/nats-tls/ca.crt
{{- if $root.Values.natsTls.clientCertificate }}
- name: HERMES_NATS_TLS_CERT_FILE
  value: /etc/hermes/nats-tls/tls.crt
- name: HERMES_NATS_TLS_KEY_FILE
  value: /etc/hermes/nats-tls/tls.key
{{- end }}
{{- end }}
- name: HERMES_METRICS_LISTEN
  value: {{ printf "0.0.0.0:%d" (int $root.Values.metricsPort) | quote }}
- name: RUST_LOG
  value: {{ $root.Values.logLevel | quote }}
{{- if $root.Values.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $root.Values.otlpEndpoint | quote }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ printf "k8s.namespace.name=%s" $root.Release.Namespace | quote }}
{{- end -}}

{{/* LLM settings; include with (dict "root" $ "secret" <apiKeySecret or nil>). */}}
{{- define "hermes.llmEnv" -}}
{{- $llm := .root.Values.llm -}}
{{- if $llm.baseUrl }}
- name: HERMES_LLM_BASE_URL
  value: {{ $llm.baseUrl | quote }}
{{- end }}
{{- if $llm.model }}
- name: HERMES_LLM_MODEL
  value: {{ $llm.model | quote }}
{{- end }}
{{- $secret := $llm.apiKeySecret -}}
{{- if and .secret .secret.name }}{{ $secret = .secret }}{{ end }}
{{- if $secret.name }}
- name: HERMES_LLM_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $secret.name }}
      key: {{ $secret.key }}
{{- end }}
{{- end -}}

{{/* Extra env from a map. */}}
{{- define "hermes.extraEnv" -}}
{{- range $name, $value := . }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end -}}

{{/*
Volumes for the Deployment's own NATS credentials file and a writable /tmp (the root filesystem
is read-only). Include with (dict "root" $ "nats" <entry from hermes.natsUser>). Only the one key
is mounted, so a Secret holding several services' files gives each pod only its own.
*/}}
{{- define "hermes.volumes" -}}
- name: tmp
  emptyDir: {}
{{- if .nats.credentialsSecret.name }}
- name: nats-creds
  secret:
    secretName: {{ .nats.credentialsSecret.name }}
    items:
      - key: {{ .nats.credentialsSecret.key }}
        path: {{ .nats.credentialsSecret.key }}
{{- end }}
{{- with .root.Values.natsTls.secretName }}
- name: nats-tls
  secret:
    secretName: {{ . }}
    {{- if $.root.Values.podSecurityContext.fsGroup }}
    defaultMode: 0440
    {{- end }}
    items:
      - key: ca.crt
        path: ca.crt
      {{- if $.root.Values.natsTls.clientCertificate }}
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      {{- end }}
{{- end }}
{{- end -}}

{{- define "hermes.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .nats.credentialsSecret.name }}
- name: nats-creds
  mountPath: /etc/hermes/nats
  readOnly: true
{{- end }}
{{- if .root.Values.natsTls.secretName }}
- name: nats-tls
  mountPath: /etc/hermes/nats-tls
  readOnly: true
{{- end }}
{{- end -}}

{{/*
The port of a URL, for the NetworkPolicy: include with (dict "url" "http://host:8000/v1"), and
"default" for a protocol whose port the scheme does not say (OTLP/gRPC: 4317). Empty without a URL.
*/}}
{{- define "hermes.urlPort" -}}
{{- if .url -}}
{{- $u := urlParse .url -}}
{{- if regexMatch ":[0-9]+$" $u.host -}}
{{- regexFind "[0-9]+$" $u.host -}}
{{- else if .default -}}
{{- .default -}}
{{- else if eq $u.scheme "https" -}}
443
{{- else if eq $u.scheme "http" -}}
80
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Which of a component's servers serve TLS (values `tls`), as JSON {"grpc": bool, "http": bool}:
include with (dict "root" $ "component" "dispatcher") and read with fromJson. The dispatcher's
gRPC and HTTP follow tls.grpc and tls.http, the registry's and memory's gRPC tls.internal; the
planner and the executor pools serve nothing but metrics, which stay plain.
*/}}
{{- define "hermes.tlsDoors" -}}
{{- $tls := .root.Values.tls -}}
{{- $on := not (empty $tls.secretName) -}}
{{- $grpc := false -}}
{{- $http := false -}}
{{- if eq .component "dispatcher" -}}
{{- $grpc = and $on $tls.grpc -}}
{{- $http = and $on $tls.http (gt (int .root.Values.dispatcher.httpPort) 0) -}}
{{- else if has .component (list "registry" "memory") -}}
{{- $grpc = and $on $tls.internal -}}
{{- end -}}
{{- toJson (dict "grpc" $grpc "http" $http) -}}
{{- end -}}

{{/*
The settings of a component's TLS doors (from hermes.tlsDoors), added to its `config` dict:
include with (dict "root" $ "doors" $doors "config" $config); renders nothing. The files are
those of the `tls` volume (hermes.tlsVolume), mounted at /etc/hermes/tls.
*/}}
{{- define "hermes.tlsConfig" -}}
{{- $ca := .root.Values.tls.clientCaSecret.name -}}
{{- range $door, $prefix := dict "grpc" "HERMES_GRPC_TLS" "http" "HERMES_DISPATCHER_HTTP_TLS" -}}
{{- if get $.doors $door -}}
{{- $_ := set $.config (printf "%s_CERT_FILE" $prefix) "/etc/hermes/tls/tls.crt" -}}
{{- $_ := set $.config (printf "%s_KEY_FILE" $prefix) "/etc/hermes/tls/tls.key" -}}
{{- if $ca }}{{ $_ := set $.config (printf "%s_CLIENT_CA_FILE" $prefix) "/etc/hermes/tls/ca.crt" }}{{ end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The `tls` volume: the certificate and key of tls.secretName (tls.crt, tls.key) and, for mTLS,
the client CAs (ca.crt), in one read-only directory. Only those keys are projected, so a Secret
holding more (cert-manager's ca.crt) gives the pod no more than it uses.
*/}}
{{- define "hermes.tlsVolume" -}}
{{- $tls := .Values.tls -}}
- name: tls
  projected:
    {{- if .Values.podSecurityContext.fsGroup }}
    # The owner and the pod's fsGroup only: the key is not world-readable.
    defaultMode: 0440
    {{- end }}
    sources:
      - secret:
          name: {{ $tls.secretName }}
          items:
            - key: tls.crt
              path: tls.crt
            - key: tls.key
              path: tls.key
      {{- with $tls.clientCaSecret.name }}
      - secret:
          name: {{ . }}
          items:
            - key: {{ $tls.clientCaSecret.key }}
              path: ca.crt
      {{- end }}
{{- end -}}

{{/* A gRPC probe on `port`, for the services that serve grpc.health.v1. */}}
{{- define "hermes.grpcProbes" -}}
readinessProbe:
  grpc:
    port: {{ . }}
  periodSeconds: 5
  failureThreshold: 3
livenessProbe:
  grpc:
    port: {{ . }}
  initialDelaySeconds: 10
  periodSeconds: 10
  failureThreshold: 6
{{- end -}}

{{/*
An HTTP probe on /healthz of the metrics port (always plain HTTP), for services without a gRPC
port and those whose gRPC serves TLS: the kubelet's grpc probe cannot speak TLS.
*/}}
{{- define "hermes.httpProbes" -}}
readinessProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: 5
  failureThreshold: 3
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  initialDelaySeconds: 10
  periodSeconds: 10
  failureThreshold: 6
{{- end -}}
