{{/*
Names and labels shared by the templates, and radixgate.yaml itself.
*/}}

{{/* The chart's name, or nameOverride. */}}
{{- define "radixgate.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Every object's name: fullnameOverride; else the release name when it
already says radixgate (`helm install radixgate ...`); else
`<release>-radixgate`. At most 63 characters, as a label value must be.
*/}}
{{- define "radixgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "radixgate.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "radixgate.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The labels that select the router pods; never changed by an upgrade. */}}
{{- define "radixgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "radixgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "radixgate.labels" -}}
{{ include "radixgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The service account the router runs as. */}}
{{- define "radixgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "radixgate.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/*
The top-level selector's labels, as YAML: discovery.selector, else
radixgate/worker=true when there are no pools either (else none: the pools
alone). Not a default in values.yaml: Helm would merge it into the
operator's own selector.
*/}}
{{- define "radixgate.selector" -}}
{{- $d := .Values.discovery -}}
{{- if $d.selector -}}
{{- $d.selector | toYaml -}}
{{- else if not $d.pools -}}
{{- dict "radixgate/worker" "true" | toYaml -}}
{{- else -}}
{{- dict | toYaml -}}
{{- end -}}
{{- end -}}

{{/* The namespace discovery watches; empty when it watches all. */}}
{{- define "radixgate.watchedNamespace" -}}
{{- if not .Values.discovery.allNamespaces -}}
{{- .Values.discovery.namespace | default .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/*
terminationGracePeriodSeconds: the value, or the preStop sleep, the
shutdown delay and the grace period together plus 10 s. A value shorter
than that is refused: after its grace period the router still ends the
streams it cut (1 s) and flushes its spans (up to 5 s), and Kubernetes
would kill it before.
*/}}
{{- define "radixgate.terminationGracePeriod" -}}
{{- $s := .Values.server -}}
{{- $needed := add (int .Values.preStopSleepSeconds) (int $s.shutdownDelaySecs) (int $s.shutdownGracePeriodSecs) -}}
{{- if eq (toString .Values.terminationGracePeriodSeconds) "" -}}
{{- add $needed 10 -}}
{{- else if lt (int .Values.terminationGracePeriodSeconds) (add $needed 10) -}}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be at least preStopSleepSeconds + server.shutdownDelaySecs + server.shutdownGracePeriodSecs + 10 (%d): the router ends the streams it cut and flushes its spans after its grace period, and the kubelet would kill it first" (int .Values.terminationGracePeriodSeconds) (add $needed 10)) -}}
{{- else -}}
{{- int .Values.terminationGracePeriodSeconds -}}
{{- end -}}
{{- end -}}

{{/*
radixgate.yaml: `config`, with the keys the chart manages set from their
own values over it. Refuses a grace period shorter than the longest
request, and an unbounded request time.
*/}}
{{- define "radixgate.config" -}}
{{- include "radixgate.knownValues" . -}}
{{- $s := .Values.server -}}
{{- if eq (int $s.requestTimeoutSecs) 0 -}}
{{- fail "server.requestTimeoutSecs must not be 0 here: a rollout cannot wait for a request without an end" -}}
{{- end -}}
{{- if lt (int $s.shutdownGracePeriodSecs) (int $s.requestTimeoutSecs) -}}
{{- fail (printf "server.shutdownGracePeriodSecs (%d) must be at least server.requestTimeoutSecs (%d), or a rollout cuts the longest streams" (int $s.shutdownGracePeriodSecs) (int $s.requestTimeoutSecs)) -}}
{{- end -}}
{{- $server := dict
    "host" $s.host
    "port" (int $s.port)
    "request_timeout_secs" (int $s.requestTimeoutSecs)
    "shutdown_grace_period_secs" (int $s.shutdownGracePeriodSecs)
    "shutdown_delay_secs" (int $s.shutdownDelaySecs)
    "drain_timeout_secs" (int $s.drainTimeoutSecs)
    "worker_allowlist" $s.workerAllowlist -}}
{{- $d := .Values.discovery -}}
{{- $discovery := dict "enabled" (and $d.enabled true) -}}
{{- if $d.enabled -}}
{{- /* Written only when discovery is on: the router warns that a port
without discovery does nothing. */ -}}
{{- $_ := set $discovery "port" (include "radixgate.workerPort" (list "discovery.port" $d.port) | int) -}}
{{- $_ := set $discovery "selector" (include "radixgate.selector" . | fromYaml) -}}
{{- $_ := set $discovery "namespace" (include "radixgate.watchedNamespace" . | default nil) -}}
{{- if $d.portAnnotation }}{{ $_ := set $discovery "port_annotation" $d.portAnnotation }}{{ end -}}
{{- if $d.modelIdFrom }}{{ $_ := set $discovery "model_id_from" $d.modelIdFrom }}{{ end -}}
{{- if $d.bootstrapPortAnnotation }}{{ $_ := set $discovery "bootstrap_port_annotation" $d.bootstrapPortAnnotation }}{{ end -}}
{{- $pools := list -}}
{{- range $d.pools -}}
{{- $pool := dict "selector" .selector -}}
{{- if .port }}{{ $_ := set $pool "port" (include "radixgate.workerPort" (list "discovery.pools[].port" .port) | int) }}{{ end -}}
{{- if .portAnnotation }}{{ $_ := set $pool "port_annotation" .portAnnotation }}{{ end -}}
{{- if .modelIdFrom }}{{ $_ := set $pool "model_id_from" .modelIdFrom }}{{ end -}}
{{- if .models }}{{ $_ := set $pool "models" .models }}{{ end -}}
{{- if .role }}{{ $_ := set $pool "role" .role }}{{ end -}}
{{- if .bootstrapPort }}{{ $_ := set $pool "bootstrap_port" (int .bootstrapPort) }}{{ end -}}
{{- if .bootstrapPortAnnotation }}{{ $_ := set $pool "bootstrap_port_annotation" .bootstrapPortAnnotation }}{{ end -}}
{{- $pools = append $pools $pool -}}
{{- end -}}
{{- $_ := set $discovery "pools" $pools -}}
{{- end -}}
{{- $managed := dict "server" $server "discovery" $discovery -}}
{{- /* The keys written above, given again under `config`, were
overwritten without a word (`config.server.worker_allowlist` became `[]`,
a router that takes any worker): refused, naming the value to set. */ -}}
{{- $config := .Values.config | default dict -}}
{{- $owned := dict
    "server" (dict "host" "server.host" "port" "server.port" "request_timeout_secs" "server.requestTimeoutSecs" "shutdown_grace_period_secs" "server.shutdownGracePeriodSecs" "shutdown_delay_secs" "server.shutdownDelaySecs" "drain_timeout_secs" "server.drainTimeoutSecs" "worker_allowlist" "server.workerAllowlist")
    "discovery" (dict "enabled" "discovery.enabled" "port" "discovery.port" "selector" "discovery.selector" "namespace" "discovery.namespace" "port_annotation" "discovery.portAnnotation" "model_id_from" "discovery.modelIdFrom" "bootstrap_port_annotation" "discovery.bootstrapPortAnnotation" "pools" "discovery.pools") -}}
{{- range $section, $keys := $owned -}}
{{- $given := get $config $section -}}
{{- if kindIs "map" $given -}}
{{- range $key, $value := $keys -}}
{{- if hasKey $given $key -}}
{{- fail (printf "config.%s.%s would be overwritten: the chart writes it from %s; set that instead" $section $key $value) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* The container's port, the Service's target and the probes are
server.port on server.host: a flag or variable that moved the listener
left a ready pod that refused every client through the Service. The
pod's terminationGracePeriodSeconds is computed from the shutdown timing:
a flag or variable that lengthened a request or shortened the grace
period had a rollout cut streams. */ -}}
{{- $listens := "where the router listens is the chart's own (the container port, the Service and the probes are server.host and server.port)" -}}
{{- $stops := "the shutdown timing is the chart's own (terminationGracePeriodSeconds is computed from it)" -}}
{{- $flags := dict
    "port" (list "server.port" $listens)
    "host" (list "server.host" $listens)
    "request-timeout-secs" (list "server.requestTimeoutSecs" $stops)
    "shutdown-grace-period-secs" (list "server.shutdownGracePeriodSecs" $stops)
    "shutdown-delay-secs" (list "server.shutdownDelaySecs" $stops) -}}
{{- range .Values.extraArgs -}}
{{- $arg := toString . -}}
{{- range $flag, $to := $flags -}}
{{- if or (eq $arg (printf "--%s" $flag)) (hasPrefix (printf "--%s=" $flag) $arg) -}}
{{- fail (printf "extraArgs %s: %s: set %s instead" $arg (index $to 1) (index $to 0)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range .Values.extraEnv -}}
{{- $name := toString .name -}}
{{- range $flag, $to := $flags -}}
{{- if eq $name (printf "RADIXGATE_%s" ($flag | replace "-" "_" | upper)) -}}
{{- fail (printf "extraEnv %s: %s: set %s instead" $name (index $to 1) (index $to 0)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if gt (int $s.managementPort) 0 -}}
{{- if eq (int $s.managementPort) (int $s.port) -}}
{{- fail (printf "server.managementPort (%d) must differ from server.port" (int $s.managementPort)) -}}
{{- end -}}
{{- $own := (.Values.config | default dict).metrics | default dict -}}
{{- if or (hasKey $own "prometheus_port") (hasKey $own "prometheus_host") -}}
{{- fail "config.metrics.prometheus_port and prometheus_host are the chart's own (server.managementPort, on server.host): set server.managementPort instead" -}}
{{- end -}}
{{- range .Values.extraArgs -}}
{{- if hasPrefix "--prometheus-" (toString .) -}}
{{- fail (printf "extraArgs %s: the metrics port is the chart's own (server.managementPort): set that instead" (toString .)) -}}
{{- end -}}
{{- end -}}
{{- range .Values.extraEnv -}}
{{- if hasPrefix "RADIXGATE_PROMETHEUS_" (toString .name) -}}
{{- fail (printf "extraEnv %s: the metrics port is the chart's own (server.managementPort): set that instead" .name) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $managed "metrics" (dict "prometheus_port" (int $s.managementPort) "prometheus_host" $s.host) -}}
{{- end -}}
{{- if .Values.workers -}}
{{- $workers := list -}}
{{- range $i, $w := .Values.workers -}}
{{- if and (kindIs "map" $w) $w.apiKeySecret -}}
{{- $entry := omit $w "apiKeySecret" -}}
{{- $_ := set $entry "api_key_env" (include "radixgate.workerKeyVar" $i) -}}
{{- $workers = append $workers $entry -}}
{{- else -}}
{{- $workers = append $workers $w -}}
{{- end -}}
{{- end -}}
{{- $_ := set $managed "workers" $workers -}}
{{- end -}}
{{- if .Values.routing }}{{ $_ := set $managed "routing" .Values.routing }}{{ end -}}
{{- with .Values.sync -}}
{{- if .urls -}}
{{- $sync := mustMergeOverwrite (deepCopy (.settings | default dict)) (dict "urls" (include "radixgate.syncUrls" $ | fromYamlArray) "cluster" .cluster) -}}
{{- $_ := set $managed "sync" $sync -}}
{{- end -}}
{{- end -}}
{{- /* A recording takes up to (keep + 1) x max_bytes: the router's
defaults, 1.5 GiB, outgrew the data volume's default 1Gi, and the kubelet
kills a pod past its emptyDir's sizeLimit at once. 64 MiB x 4 leaves room
for more than one. */ -}}
{{- $record := dict "admin_dir" .Values.dataVolume.mountPath "max_bytes" 67108864 "keep" 3 -}}
{{- $defaults := dict "record_trace" $record -}}
{{- mustMergeOverwrite $defaults (deepCopy (.Values.config | default dict)) $managed | toYaml -}}
{{- end -}}

{{/*
A workers' port value (a list: its key, its value) as a number, or a
render error: a name ("http") read as an int was 0, which the router
refuses at start-up. Pods are not asked for their named ports.
*/}}
{{- define "radixgate.workerPort" -}}
{{- $key := index . 0 -}}
{{- $port := toString (index . 1) -}}
{{- if not (regexMatch "^[0-9]+$" $port) -}}
{{- fail (printf "%s `%s` must be a port number (1-65535): named container ports are not looked up; for a port that differs between pods, set portAnnotation" $key $port) -}}
{{- end -}}
{{- if or (lt (int $port) 1) (gt (int $port) 65535) -}}
{{- fail (printf "%s `%s` must be a port number (1-65535)" $key $port) -}}
{{- end -}}
{{- int $port -}}
{{- end -}}

{{/*
sync.urls as a YAML list: a list as given, or a string (what
`--set sync.urls=nats://...` gives) split at its commas.
*/}}
{{- define "radixgate.syncUrls" -}}
{{- $urls := .Values.sync.urls -}}
{{- if kindIs "string" $urls -}}
{{- $split := list -}}
{{- range splitList "," $urls -}}
{{- if trim . }}{{ $split = append $split (trim .) }}{{ end -}}
{{- end -}}
{{- $urls = $split -}}
{{- end -}}
{{- $urls | toYaml -}}
{{- end -}}

{{/*
The variable a worker's key from a Secret comes in (`apiKeySecret`; the
config names it as the worker's `api_key_env`).
*/}}
{{- define "radixgate.workerKeyVar" -}}
{{- printf "RADIXGATE_WORKER_KEY_%d" . -}}
{{- end -}}

{{/*
The container's variables for the workers' keys from Secrets.
*/}}
{{- define "radixgate.workerKeyEnv" -}}
{{- range $i, $w := .Values.workers -}}
{{- if and (kindIs "map" $w) $w.apiKeySecret }}
- name: {{ include "radixgate.workerKeyVar" $i }}
  valueFrom:
    secretKeyRef:
      name: {{ required "apiKeySecret.name" $w.apiKeySecret.name }}
      key: {{ required "apiKeySecret.key" $w.apiKeySecret.key }}
{{- end }}
{{- end -}}
{{- end -}}

{{/*
The port name the probes and Prometheus use: the management port's, or the
router's when there is none.
*/}}
{{- define "radixgate.managementPortName" -}}
{{- if gt (int .Values.server.managementPort) 0 -}}management{{- else -}}http{{- end -}}
{{- end -}}

{{/*
Refuses a value the chart does not know, at the top and in the sections
that stand for radixgate.yaml's (server, discovery and its pools, sync):
it would be dropped, and the router run without it (`server.api_key`: a
router open to anyone), where the router refuses an unknown key in its
own file. Each message says where the key belongs.
*/}}
{{- define "radixgate.knownValues" -}}
{{- $top := list "image" "imagePullSecrets" "nameOverride" "fullnameOverride" "replicaCount" "sync" "strategy" "server" "preStopSleepSeconds" "terminationGracePeriodSeconds" "discovery" "workers" "routing" "dataVolume" "config" "extraArgs" "extraEnv" "extraVolumes" "extraVolumeMounts" "resources" "livenessProbe" "readinessProbe" "podDisruptionBudget" "service" "serviceAccount" "rbac" "metrics" "podSecurityContext" "securityContext" "podAnnotations" "podLabels" "nodeSelector" "tolerations" "affinity" "topologySpreadConstraints" "priorityClassName" "global" -}}
{{- include "radixgate.onlyKeys" (list "" .Values $top "a section of radixgate.yaml goes under `config` (`config.%s`)") -}}
{{- $server := list "host" "port" "managementPort" "requestTimeoutSecs" "shutdownGracePeriodSecs" "shutdownDelaySecs" "drainTimeoutSecs" "workerAllowlist" -}}
{{- include "radixgate.onlyKeys" (list "server." .Values.server $server "radixgate.yaml's other server keys go under `config.server` (`config.server.%s`); a key is better passed from a Secret through extraEnv (RADIXGATE_API_KEY, RADIXGATE_ADMIN_API_KEY)") -}}
{{- $pool := list "selector" "port" "portAnnotation" "modelIdFrom" "models" "role" "bootstrapPort" "bootstrapPortAnnotation" -}}
{{- $discovery := concat (list "enabled" "namespace" "allNamespaces" "pools") (without $pool "models" "role" "bootstrapPort") -}}
{{- include "radixgate.onlyKeys" (list "discovery." .Values.discovery $discovery "radixgate.yaml's other discovery keys go under `config.discovery` (`config.discovery.%s`)") -}}
{{- range $i, $p := .Values.discovery.pools -}}
{{- if kindIs "map" $p -}}
{{- include "radixgate.onlyKeys" (list (printf "discovery.pools[%d]." $i) $p $pool "") -}}
{{- end -}}
{{- end -}}
{{- $sync := list "urls" "cluster" "settings" "secretName" "secretPath" -}}
{{- include "radixgate.onlyKeys" (list "sync." .Values.sync $sync "radixgate.yaml's other sync keys go under `sync.settings` (`sync.settings.%s`)") -}}
{{- end -}}

{{/*
Fails on a key of a map not in a list (a list: the map's path with its
trailing dot, empty at the top, the map, its keys, and where else such a
key belongs, with %s for the key; empty: nowhere else).
*/}}
{{- define "radixgate.onlyKeys" -}}
{{- $path := index . 0 -}}
{{- $known := index . 2 -}}
{{- $elsewhere := index . 3 -}}
{{- range $key, $_ := index . 1 -}}
{{- if not (has $key $known) -}}
{{- $hint := "" -}}
{{- if $elsewhere }}{{ $hint = printf "; %s" (printf $elsewhere $key) }}{{ end -}}
{{- $there := "values.yaml names them" -}}
{{- if $path }}{{ $there = printf "the values there are %s" (join ", " (sortAlpha $known)) }}{{ end -}}
{{- fail (printf "`%s%s` is not a value of the chart, and would be dropped (%s)%s" $path $key $there $hint) -}}
{{- end -}}
{{- end -}}
{{- end -}}
