{{/*
The chart's name, or nameOverride.
*/}}
{{- define "fluxpipe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the release's objects: fullnameOverride, else
"<release>-<name>", shortened to the release name when that already
contains the chart name. Kept to 63 characters (a DNS label).
*/}}
{{- define "fluxpipe.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
"<chart>-<version>" for the helm.sh/chart label.
*/}}
{{- define "fluxpipe.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels that select the release's pods; they never change over upgrades.
*/}}
{{- define "fluxpipe.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fluxpipe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of every object of the release.
*/}}
{{- define "fluxpipe.labels" -}}
helm.sh/chart: {{ include "fluxpipe.chart" . }}
{{ include "fluxpipe.selectorLabels" . }}
app.kubernetes.io/version: {{ include "fluxpipe.imageTag" . | quote }}
app.kubernetes.io/component: pipeline
app.kubernetes.io/part-of: fluxpipe
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The image tag: image.tag, else the chart's appVersion.
*/}}
{{- define "fluxpipe.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/*
The full image reference; a digest, when given, wins over the tag.
*/}}
{{- define "fluxpipe.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "fluxpipe.imageTag" .) }}
{{- end }}
{{- end }}

{{/*
The service account the pods run as.
*/}}
{{- define "fluxpipe.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fluxpipe.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
True when the Prometheus Operator's API (monitoring.coreos.com/v1) is
served by the cluster (or passed with `helm template --api-versions`).
*/}}
{{- define "fluxpipe.hasMonitoringAPI" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}
