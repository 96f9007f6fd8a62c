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

{{/* etcd endpoints: the configured ones, else the bundled etcd's Service */}}
{{- define "cellar.etcdEndpoints" -}}
{{- if .Values.etcd.endpoints -}}
{{- .Values.etcd.endpoints -}}
{{- else if .Values.etcd.enabled -}}
{{- printf "%s-etcd.%s.svc:2379" (.Release.Name | trunc 58 | trimSuffix "-") .Release.Namespace -}}
{{- else -}}
{{- fail "set etcd.endpoints or etcd.enabled=true: the masters elect their leader in etcd" -}}
{{- end -}}
{{- end -}}

{{- define "cellar.masterUrl" -}}
etcd://{{ include "cellar.etcdEndpoints" . }}/{{ .Values.clusterName }}
{{- end -}}
