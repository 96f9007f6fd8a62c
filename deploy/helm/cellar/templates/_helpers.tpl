{{- define "cellar.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "cellar.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "cellar.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cellar.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "cellar.secretName" -}}
{{- .Values.clusterSecret.existingSecret | default (printf "%s-secret" (include "cellar.fullname" .)) -}}
{{- end -}}

{{/* the bundled etcd's Service name (charts/etcd names it so) */}}
{{- define "cellar.bundledEtcdName" -}}
{{- printf "%s-etcd" (.Release.Name | trunc 58 | trimSuffix "-") -}}
{{- end -}}

{{/* etcd endpoints: the configured ones, else the bundled etcd's Service */}}
{{- define "cellar.etcdEndpoints" -}}
{{- if .Values.etcd.endpoints -}}
{{- .Values.etcd.endpoints -}}
{{- else if .Values.etcd.enabled -}}
{{- printf "%s.%s.svc:2379" (include "cellar.bundledEtcdName" .) .Release.Namespace -}}
{{- else -}}
{{- fail "set etcd.endpoints or etcd.enabled=true: the masters elect their leader in etcd" -}}
{{- end -}}
{{- end -}}

{{/* the Secret the masters and nodes reach etcd over TLS with: etcd.tls.secretName (an external
etcd's client side), or etcd.serverTls.secretName (the bundled etcd's own); empty: plaintext */}}
{{- define "cellar.etcdTlsSecret" -}}
{{- if .Values.etcd.tls.secretName -}}
{{- if not .Values.etcd.endpoints -}}
{{- fail "etcd.tls.secretName is for an external etcd (etcd.endpoints); the bundled etcd's TLS is etcd.serverTls.secretName" -}}
{{- end -}}
{{- .Values.etcd.tls.secretName -}}
{{- else if and .Values.etcd.enabled (not .Values.etcd.endpoints) .Values.etcd.serverTls.secretName -}}
{{- .Values.etcd.serverTls.secretName -}}
{{- end -}}
{{- end -}}

{{/* the env of TLS to etcd (cellar.etcdTlsSecret, mounted at /etc/cellar/etcd-tls), for the
masters and nodes */}}
{{- define "cellar.etcdTlsEnv" -}}
{{- if include "cellar.etcdTlsSecret" . }}
# TLS to etcd (coord/etcd_tls.py): never plaintext once the CA is set
- name: CELLAR_ETCD_CA_FILE
  value: /etc/cellar/etcd-tls/ca.crt
- name: CELLAR_ETCD_CERT_FILE
  value: /etc/cellar/etcd-tls/tls.crt
- name: CELLAR_ETCD_KEY_FILE
  value: /etc/cellar/etcd-tls/tls.key
{{- with .Values.etcd.tls.serverName }}
- name: CELLAR_ETCD_SERVER_NAME
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "cellar.masterUrl" -}}
etcd://{{ include "cellar.etcdEndpoints" . }}/{{ .Values.clusterName }}
{{- end -}}

{{/* the masters' headless Service: one DNS name per master pod (the address each advertises) */}}
{{- define "cellar.masterPods" -}}
{{- printf "%s-master-pods" (include "cellar.fullname" .) -}}
{{- end -}}

{{/* the Secret (kubernetes.io/tls: tls.crt, tls.key, ca.crt) every port's TLS comes from */}}
{{- define "cellar.tlsSecretName" -}}
{{- if .Values.tls.secretName -}}
{{- .Values.tls.secretName -}}
{{- else if .Values.tls.certManager.issuerName -}}
{{- printf "%s-tls" (include "cellar.fullname" .) -}}
{{- else -}}
{{- fail "tls.enabled needs tls.secretName (a kubernetes.io/tls Secret with ca.crt) or tls.certManager.issuerName" -}}
{{- end -}}
{{- end -}}

{{/* every name a client, node, probe or scraper verifies the certificate against: the masters'
Service (short, namespaced, cluster-qualified), each master pod and each node pod (wildcards
of the headless Services: the addresses they advertise), and localhost (an operator's
`kubectl port-forward` to the status page, as NOTES.txt shows it) */}}
{{- define "cellar.tlsDnsNames" -}}
{{- $full := include "cellar.fullname" . -}}
{{- $ns := .Release.Namespace -}}
- {{ $full }}-master
- {{ $full }}-master.{{ $ns }}.svc
- {{ $full }}-master.{{ $ns }}.svc.cluster.local
- "*.{{ include "cellar.masterPods" . }}.{{ $ns }}.svc"
- "*.{{ $full }}-node.{{ $ns }}.svc"
- localhost
{{- if and .Values.etcd.enabled (not .Values.etcd.endpoints) }}
{{- $etcd := include "cellar.bundledEtcdName" . }}
- {{ $etcd }}
- {{ $etcd }}.{{ $ns }}.svc
- {{ $etcd }}.{{ $ns }}.svc.cluster.local
{{- end }}
{{- end -}}


{{/* the Secret of the masters' token store: the operator's, or the one the chart creates */}}
{{- define "cellar.tokensSecretName" -}}
{{- .Values.tokens.existingSecret | default (printf "%s-tokens" (include "cellar.fullname" .)) -}}
{{- end -}}
