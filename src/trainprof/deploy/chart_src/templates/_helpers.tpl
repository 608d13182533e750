{{/* Names and labels shared by every template. */}}

{{- define "trainprof.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "trainprof.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object: the recommended app.kubernetes.io set plus commonLabels. */}}
{{- define "trainprof.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | quote }}
app.kubernetes.io/name: {{ include "trainprof.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
app.kubernetes.io/part-of: trainprof
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The labels kube-prometheus-stack's selectors look for, on every monitoring object. */}}
{{- define "trainprof.monitoringLabels" -}}
{{- with .Values.monitoring.release }}
release: {{ . | quote }}
{{- end }}
{{- with .Values.monitoring.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* selector labels of one component; call with (dict "root" $ "component" "exporter") */}}
{{- define "trainprof.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainprof.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name | quote }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "trainprof.image" -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .root.Chart.AppVersion) -}}
{{- end -}}

{{- define "trainprof.actionsSecret" -}}
{{- .Values.actions.existingSecret | default (printf "%s-actions-token" (include "trainprof.fullname" .)) -}}
{{- end -}}

{{/* The identity relabelling, generated from trainprof.relabel (see helm/trainprof/README.md). */}}
{{- define "trainprof.exporterRelabelings" -}}
{{- .Files.Get "files/relabelings/exporter.yaml" | fromYamlArray | toYaml -}}
{{- end -}}

{{/* Where the exporter reads dcgm-exporter: the value, else the node-local Service. */}}
{{- define "trainprof.dcgmExporterURL" -}}
{{- $d := .Values.exporter.dcgmExporter -}}
{{- if $d.url -}}
{{- $d.url -}}
{{- else -}}
{{- printf "http://%s-dcgm-exporter-local.%s.svc:%d/metrics" (include "trainprof.fullname" .) $d.localService.namespace (int $d.localService.port) -}}
{{- end -}}
{{- end -}}
