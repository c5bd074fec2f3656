{{/* The five services, in the order their manifests are written. */}}
{{- define "palisade.services" -}}
admission dispatch ingestion enrichment reaper
{{- end -}}

{{- define "palisade.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "palisade.fullname" -}}
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

{{/* A component's resource name: <fullname>-<component>. */}}
{{- define "palisade.componentName" -}}
{{- printf "%s-%s" (include "palisade.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "palisade.selectorLabels" -}}
app.kubernetes.io/name: {{ include "palisade.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "palisade.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "palisade.selectorLabels" . }}
app.kubernetes.io/part-of: palisade
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{- define "palisade.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "palisade.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "palisade.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
`-n <namespace> ` for the kubectl commands the chart prints, or nothing where the render has no
namespace (`helm lint`), so the command uses kubectl's current namespace: never `kubectl -n  …`.
*/}}
{{- define "palisade.kubectlNamespace" -}}
{{- with .Release.Namespace }}-n {{ . }} {{ end -}}
{{- end -}}

{{/* The Secret DATABASE_URL comes from; required. */}}
{{- define "palisade.databaseSecret" -}}
{{- required "database.existingSecret is required: create a Secret holding DATABASE_URL (kubectl create secret generic palisade-database --from-literal=DATABASE_URL=postgres://...) and name it here" .Values.database.existingSecret -}}
{{- end -}}

{{/*
Secure by default (docs/deploy.md, "Secure defaults"): NATS credentials and TLS are required
unless a value named INSECURE turns each off; a CA never goes without TLS being required.
Fails the render naming every problem at once: what to provide, and how to opt out.
*/}}
{{- define "palisade.validateNats" -}}
{{- $nats := .Values.nats -}}
{{- $problems := list -}}
{{- if and (not $nats.credentials.existingSecret) (not $nats.insecureNoCredentials) -}}
{{- $problems = append $problems (printf "nats.credentials.existingSecret is empty: palisade connects to NATS with credentials. Run `palisade nats init --dir palisade-authority --resolver-dir /data/jwt`, include the nats-server-auth.conf it writes in every NATS server's configuration (docs/deploy.md, section 3), then `kubectl %screate secret generic palisade-nats-credentials --from-file=palisade-authority/admission.creds --from-file=palisade-authority/dispatch.creds --from-file=palisade-authority/ingestion.creds --from-file=palisade-authority/enrichment.creds --from-file=palisade-authority/reaper.creds --from-file=palisade-authority/enrollment.nk` and set nats.credentials.existingSecret=palisade-nats-credentials. To run against a server that authenticates nobody (INSECURE: any process may act as any service, worker or tenant), set nats.insecureNoCredentials=true instead." (include "palisade.kubectlNamespace" .)) -}}
{{- end -}}
{{- if and $nats.credentials.existingSecret $nats.insecureNoCredentials -}}
{{- $problems = append $problems "nats.insecureNoCredentials is true and nats.credentials.existingSecret is set: remove nats.insecureNoCredentials (the credentials are used) or empty the Secret's name." -}}
{{- end -}}
{{- if and (not $nats.tls.existingSecret) (not $nats.insecureNoTls) -}}
{{- $problems = append $problems (printf "nats.tls.existingSecret is empty: palisade requires TLS to NATS. Create a Secret with ca.crt, the authority that signed the NATS servers' certificates (`kubectl %screate secret generic palisade-nats-tls --from-file=ca.crt`; add tls.crt and tls.key and set nats.tls.clientCertificate=true for servers that verify clients), and set nats.tls.existingSecret=palisade-nats-tls. To connect in clear (INSECURE: targets, findings and lease tokens readable on the network, the server unauthenticated), set nats.insecureNoTls=true instead." (include "palisade.kubectlNamespace" .)) -}}
{{- end -}}
{{- if and $nats.tls.existingSecret $nats.insecureNoTls -}}
{{- $problems = append $problems "nats.insecureNoTls is true and nats.tls.existingSecret is set: a CA without TLS required could connect in clear; remove nats.insecureNoTls (TLS is then required) or empty the Secret's name." -}}
{{- end -}}
{{- if and $nats.tls.existingSecret (eq (toString .Values.config.NATS_TLS_REQUIRED) "false") -}}
{{- $problems = append $problems "config.NATS_TLS_REQUIRED is false while nats.tls.existingSecret is set: with a CA the chart always requires TLS (a nats:// URL is upgraded to TLS, or the server is refused); leave config.NATS_TLS_REQUIRED null or true, or set nats.insecureNoTls=true and empty nats.tls.existingSecret to connect in clear (INSECURE)." -}}
{{- end -}}
{{- if $problems -}}
{{- fail (printf "\n\npalisade's chart is secure by default and will not render (docs/deploy.md, \"Secure defaults\"):\n- %s\n" (join "\n- " $problems)) -}}
{{- end -}}
{{- end -}}

{{/* NATS_TLS_REQUIRED as the ConfigMap holds it: true whenever a CA is mounted; else config's. */}}
{{- define "palisade.natsTlsRequired" -}}
{{- if .Values.nats.tls.existingSecret -}}
true
{{- else if not (kindIs "invalid" .Values.config.NATS_TLS_REQUIRED) -}}
{{- toString .Values.config.NATS_TLS_REQUIRED -}}
{{- end -}}
{{- end -}}

{{/* Pod-level settings every component shares. */}}
{{- define "palisade.podCommon" -}}
serviceAccountName: {{ .serviceAccount | default (include "palisade.serviceAccountName" .root) }}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .root.Values.pod.securityContext | nindent 2 }}
{{- with .root.Values.image.pullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.pod.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.pod.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.pod.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.pod.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- if .root.Values.pod.topologySpread.enabled }}
topologySpreadConstraints:
{{- range .root.Values.pod.topologySpread.topologyKeys }}
  - maxSkew: {{ $.root.Values.pod.topologySpread.maxSkew }}
    topologyKey: {{ . }}
    whenUnsatisfiable: {{ $.root.Values.pod.topologySpread.whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- include "palisade.selectorLabels" $ | nindent 8 }}
    matchLabelKeys:
      - pod-template-hash
{{- end }}
{{- end }}
{{- end -}}

{{/* Pod metadata: labels, the configuration's checksum (a changed ConfigMap rolls the pods). */}}
{{- define "palisade.podMetadata" -}}
labels:
  {{- include "palisade.labels" . | nindent 2 }}
  {{- with .root.Values.pod.labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  checksum/config: {{ include (print .root.Template.BasePath "/configmap.yaml") .root | sha256sum }}
  {{- with .root.Values.pod.annotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/*
The environment every palisade container gets besides the ConfigMap: DATABASE_URL from its
Secret (unless .noDatabase), the OTLP settings, NATS_CREDS (.creds names the file, when NATS
authenticates) and the NATS TLS files.
*/}}
{{- define "palisade.env" -}}
{{- $values := .root.Values -}}
{{- if not .noDatabase }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "palisade.databaseSecret" .root }}
      key: {{ $values.database.existingSecretKey }}
{{- end }}
{{- if and .creds $values.nats.credentials.existingSecret }}
- name: NATS_CREDS
  value: /etc/palisade/nats/{{ .creds }}
{{- if and (eq .component "dispatch") $values.nats.credentials.enrollmentKey }}
- name: PALISADE_NATS_ENROLLMENT_KEY
  value: /etc/palisade/nats/enrollment.nk
{{- end }}
{{- end }}
{{- if $values.nats.tls.existingSecret }}
- name: NATS_TLS_CA
  value: /etc/palisade/nats-tls/ca.crt
{{- if $values.nats.tls.clientCertificate }}
- name: NATS_TLS_CERT
  value: /etc/palisade/nats-tls/tls.crt
- name: NATS_TLS_KEY
  value: /etc/palisade/nats-tls/tls.key
{{- end }}
{{- end }}
{{- with $values.otlp.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- with $values.otlp.protocol }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ . | quote }}
{{- end }}
{{- with $values.otlp.tracesEndpoint }}
- name: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- with $values.otlp.tracesProtocol }}
- name: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
  value: {{ . | quote }}
{{- end }}
- name: OTEL_SERVICE_NAME
  value: {{ printf "%s%s" $values.otlp.serviceNamePrefix .component | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ $values.otlp.sampler | quote }}
{{- if ne (toString $values.otlp.samplerArg) "" }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ toString $values.otlp.samplerArg | quote }}
{{- end }}
{{- end -}}

{{/* Volumes of the NATS credentials (only .creds) and TLS files. */}}
{{- define "palisade.natsVolumes" -}}
{{- $values := .root.Values -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- if and .creds $values.nats.credentials.existingSecret }}
- name: nats-creds
  secret:
    secretName: {{ $values.nats.credentials.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ .creds }}
        path: {{ .creds }}
      {{- if and (eq .component "dispatch") $values.nats.credentials.enrollmentKey }}
      - key: enrollment.nk
        path: enrollment.nk
      {{- end }}
{{- end }}
{{- if $values.nats.tls.existingSecret }}
- name: nats-tls
  secret:
    secretName: {{ $values.nats.tls.existingSecret }}
    defaultMode: 0440
    items:
      - key: ca.crt
        path: ca.crt
      {{- if $values.nats.tls.clientCertificate }}
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      {{- end }}
{{- end }}
{{- end -}}

{{- define "palisade.natsVolumeMounts" -}}
{{- $values := .root.Values -}}
- name: tmp
  mountPath: /tmp
{{- if and .creds $values.nats.credentials.existingSecret }}
- name: nats-creds
  mountPath: /etc/palisade/nats
  readOnly: true
{{- end }}
{{- if $values.nats.tls.existingSecret }}
- name: nats-tls
  mountPath: /etc/palisade/nats-tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* A NetworkPolicy egress rule to .to (any address when empty) on TCP .ports. */}}
{{- define "palisade.egressRule" -}}
- ports:
    {{- range .ports }}
    - protocol: TCP
      port: {{ . }}
    {{- end }}
  {{- with .to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* DNS: UDP and TCP .ports to .to. */}}
{{- define "palisade.dnsRule" -}}
- ports:
    {{- range .ports }}
    - protocol: UDP
      port: {{ . }}
    - protocol: TCP
      port: {{ . }}
    {{- end }}
  {{- with .to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
