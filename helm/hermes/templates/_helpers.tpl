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

{{/* Environment every Hermes container shares: NATS, logs, traces. */}}
{{- define "hermes.commonEnv" -}}
{{- if and (not .Values.nats.enabled) .Values.externalNats.urlSecret.name }}
- name: HERMES_NATS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.externalNats.urlSecret.name }}
      key: {{ .Values.externalNats.urlSecret.key }}
{{- else if .Values.nats.enabled }}
- name: HERMES_NATS_URL
  value: {{ default (printf "nats://%s-nats:4222" .Release.Name) .Values.nats.url | quote }}
{{- else }}
- name: HERMES_NATS_URL
  value: {{ .Values.externalNats.url | quote }}
{{- end }}
- name: HERMES_NATS_REPLICAS
  value: {{ .Values.streamReplicas | quote }}
{{- if and (not .Values.nats.enabled) .Values.externalNats.credentialsSecret.name }}
- name: HERMES_NATS_CREDS
  value: /etc/hermes/nats/{{ .Values.externalNats.credentialsSecret.key }}
{{- end }}
- name: HERMES_METRICS_LISTEN
  value: {{ printf "0.0.0.0:%d" (int .Values.metricsPort) | quote }}
- name: RUST_LOG
  value: {{ .Values.logLevel | quote }}
{{- if .Values.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.otlpEndpoint | quote }}
{{- end }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ printf "k8s.namespace.name=%s" .Release.Namespace | quote }}
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

{{/* Volumes for the NATS credentials file and a writable /tmp (the root filesystem is read-only). */}}
{{- define "hermes.volumes" -}}
- name: tmp
  emptyDir: {}
{{- if and (not .Values.nats.enabled) .Values.externalNats.credentialsSecret.name }}
- name: nats-creds
  secret:
    secretName: {{ .Values.externalNats.credentialsSecret.name }}
{{- end }}
{{- end -}}

{{- define "hermes.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if and (not .Values.nats.enabled) .Values.externalNats.credentialsSecret.name }}
- name: nats-creds
  mountPath: /etc/hermes/nats
  readOnly: true
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

{{/* An HTTP probe on /healthz of the metrics port, for services without a gRPC port. */}}
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
