{{/*
Names and labels, following `helm create`'s conventions.
*/}}

{{- define "infergate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name. Truncated to leave room for the longest suffix the
chart adds ("-controller", 11 characters) within the 63 characters of a DNS
label.
*/}}
{{- define "infergate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "infergate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "infergate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "infergate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "infergate.labels" -}}
helm.sh/chart: {{ include "infergate.chart" . }}
{{ include "infergate.selectorLabels" . }}
app.kubernetes.io/version: {{ include "infergate.imageTag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: infergate
{{- end }}

{{/*
Per-component labels. Call with (dict "root" $ "component" "extproc").
*/}}
{{- define "infergate.componentSelectorLabels" -}}
{{ include "infergate.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "infergate.componentLabels" -}}
{{ include "infergate.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
The component that serves ext_proc: `serve` runs everything in one process,
`extproc` is the ext_proc half of scaled mode.
*/}}
{{- define "infergate.extprocComponent" -}}
{{- if eq .Values.mode "scaled" }}extproc{{ else }}serve{{ end }}
{{- end }}

{{- define "infergate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "infergate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "infergate.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "infergate.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "infergate.imageTag" .) }}
{{- end }}

{{/*
Whether infergate runs virtual models (and so an SLA controller and xDS).
*/}}
{{- define "infergate.hasVirtualModels" -}}
{{- if .Values.config.virtualModels }}true{{ end }}
{{- end }}

{{/*
Whether infergate is Envoy Gateway's extension server for InferencePools.
*/}}
{{- define "infergate.gatewayExtension" -}}
{{- if .Values.inferencePools.extensionServer.enabled }}true{{ end }}
{{- end }}

{{/*
Whether the xDS port serves: xDS for the virtual models, or Envoy
Gateway's extension.
*/}}
{{- define "infergate.servesXDS" -}}
{{- if or (include "infergate.hasVirtualModels" .) (include "infergate.gatewayExtension" .) }}true{{ end }}
{{- end }}

{{/*
The Kubernetes object the SLA controller writes its weights to, when its
weightSink is one (config.weightSink.type httpRoute or virtualService):
"resource|namespace|name|apiGroup", else empty.
*/}}
{{- define "infergate.weightSinkObject" -}}
{{- $ws := .Values.config.weightSink | default dict }}
{{- if and (include "infergate.hasVirtualModels" .) (eq ($ws.type | default "") "httpRoute") }}
{{- printf "httproutes|%s|%s|gateway.networking.k8s.io" $ws.httpRoute.namespace $ws.httpRoute.name }}
{{- else if and (include "infergate.hasVirtualModels" .) (eq ($ws.type | default "") "virtualService") }}
{{- printf "virtualservices|%s|%s|networking.istio.io" $ws.virtualService.namespace $ws.virtualService.name }}
{{- end }}
{{- end }}

{{/*
The InferencePools whose pods the SLA controller follows
(config.virtualModels[].pools[].inferencePool), as JSON: namespace → sorted
names; "{}" when none.
*/}}
{{- define "infergate.followedInferencePools" -}}
{{- $byNS := dict }}
{{- if include "infergate.hasVirtualModels" . }}
{{- range .Values.config.virtualModels }}
{{- range .pools }}
{{- with .inferencePool }}
{{- $_ := set $byNS .namespace (append (get $byNS .namespace | default list) .name | uniq | sortAlpha) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- toJson $byNS }}
{{- end }}

{{- define "infergate.apiKeysSecret" -}}
{{- if .Values.apiKeys.existingSecret }}
{{- .Values.apiKeys.existingSecret }}
{{- else if .Values.apiKeys.keys }}
{{- printf "%s-apikeys" (include "infergate.fullname" .) }}
{{- end }}
{{- end }}

{{/*
Whether the ext_proc port serves mutual TLS: extproc.tls.enabled true, or
"auto" (the default) where the chart can hand Envoy its client certificate,
i.e. a plain Envoy. Envoy Gateway takes Envoy's client certificate from the
Gateway, Istio's proxies bring the mesh's own: there "auto" keeps the port
plaintext, as before.
*/}}
{{- define "infergate.extprocTLSEnabled" -}}
{{- $enabled := toString .Values.extproc.tls.enabled }}
{{- if or (eq $enabled "true") (and (eq $enabled "auto") (not .Values.envoyGateway.enabled) (not .Values.istio.enabled)) }}true{{ end }}
{{- end }}

{{/*
Whether the xDS port serves mutual TLS, with the ext_proc port's Secret
(the same CA and certificate: Envoy presents the same client certificate
and checks the same name): xds.tls.enabled true, or "auto" (the default)
where the ext_proc port does for a plain Envoy, the one client of xDS
(Envoy Gateway and Istio take the weights from Kubernetes objects).
*/}}
{{- define "infergate.xdsTLSEnabled" -}}
{{- $enabled := toString .Values.xds.tls.enabled }}
{{- if and (include "infergate.extprocTLSEnabled" .) (or (eq $enabled "true") (and (eq $enabled "auto") (not .Values.envoyGateway.enabled) (not .Values.istio.enabled))) }}true{{ end }}
{{- end }}

{{/*
Whether the chart generates the certificates: mutual TLS with neither a
Secret named nor cert-manager.
*/}}
{{- define "infergate.extprocTLSGenerated" -}}
{{- with .Values.extproc.tls }}
{{- if and (include "infergate.extprocTLSEnabled" $) .generate (not .secretName) (not .certManager.issuerRef) }}true{{ end }}
{{- end }}
{{- end }}

{{/*
The Secret with the ext_proc port's certificate, key and client CA, when
the port serves mutual TLS: the one named, or the one cert-manager issues
or the chart generates.
*/}}
{{- define "infergate.extprocTLSSecret" -}}
{{- if include "infergate.extprocTLSEnabled" . }}
{{- default (printf "%s-extproc-tls" (include "infergate.fullname" .)) .Values.extproc.tls.secretName }}
{{- end }}
{{- end }}

{{/*
The ext_proc Service's DNS names: what infergate's certificate must name and
what Envoy checks it for (the first).
*/}}
{{- define "infergate.extprocDNSNames" -}}
{{- $fullname := include "infergate.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- $names := list (printf "%s.%s.svc.%s" $fullname $ns .Values.clusterDomain) $fullname (printf "%s.%s" $fullname $ns) (printf "%s.%s.svc" $fullname $ns) }}
{{- if .Values.service.headless }}
{{- $names = append $names (printf "%s-headless.%s.svc.%s" $fullname $ns .Values.clusterDomain) }}
{{- end }}
{{- toYaml $names }}
{{- end }}

{{/*
NetworkPolicy peers admitted to the ext_proc port: networkPolicy.extprocFrom,
or else the gateway pods the chart wires (Envoy Gateway's proxies of the
route's Gateways, Istio's ingress gateway and model-server sidecars), as
YAML; empty when there are none.
*/}}
{{- define "infergate.extprocPeers" -}}
{{- $peers := .Values.networkPolicy.extprocFrom }}
{{- if not $peers }}
{{- $peers = list }}
{{- if .Values.envoyGateway.enabled }}
{{- $gateways := .Values.envoyGateway.targetRefs }}
{{- if .Values.envoyGateway.route.enabled }}
{{- $gateways = concat $gateways .Values.envoyGateway.route.parentRefs }}
{{- end }}
{{- range $gateways }}
{{- if eq (default "Gateway" .kind) "Gateway" }}
{{- /* Envoy Gateway runs a Gateway's proxies in its own namespace by default. */}}
{{- $peers = append $peers (dict "namespaceSelector" (dict) "podSelector" (dict "matchLabels" (dict
    "gateway.envoyproxy.io/owning-gateway-name" .name
    "gateway.envoyproxy.io/owning-gateway-namespace" (default $.Release.Namespace .namespace)))) }}
{{- end }}
{{- end }}
{{- end }}
{{- if .Values.istio.enabled }}
{{- with .Values.istio.gateway }}
{{- if .enabled }}
{{- $peers = append $peers (dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" .namespace)) "podSelector" (dict "matchLabels" .workloadSelector)) }}
{{- end }}
{{- end }}
{{- with .Values.istio.sidecar }}
{{- if .enabled }}
{{- $peers = append $peers (dict "namespaceSelector" (dict "matchLabels" (dict "kubernetes.io/metadata.name" (default $.Release.Namespace .namespace))) "podSelector" (dict "matchLabels" .workloadSelector)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if $peers }}
{{- toYaml $peers }}
{{- end }}
{{- end }}

{{- define "infergate.policiesConfigMap" -}}
{{- if .Values.policies.enabled }}
{{- default (printf "%s-policies" (include "infergate.fullname" .)) .Values.policies.existingConfigMap }}
{{- end }}
{{- end }}

{{/*
The Envoy cluster Istio builds for the ext_proc port of the infergate
Service. Every sidecar and gateway that can see the Service already has it,
with endpoints from EDS and Istio's mTLS, so the EnvoyFilters need no
CLUSTER patch.
*/}}
{{- define "infergate.istioCluster" -}}
{{- printf "outbound|%d||%s.%s.svc.%s" (int .Values.ports.extproc) (include "infergate.fullname" .) .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{/*
Refuse combinations that would deploy something that cannot work, with a
message that says what to change.
*/}}
{{- define "infergate.validate" -}}
{{- $owned := dict
  "extproc.listen" "ports.extproc"
  "admin.listen" "ports.admin"
  "xds.listen" "ports.xds"
  "extproc.insecureOpenToNetwork" "extproc.tls"
  "admin.openToNetwork" "ports.admin"
  "admin.debug" "debug"
  "admin.pprof" "debug.pprof"
  "xds.insecureOpenToNetwork" "xds.tls"
  "xds.tls" "xds.tls"
  "auth.keys" "apiKeys"
  "policy.dir" "policies"
  "ratelimit.backend" "redis.address"
  "ratelimit.embedded" "ledger"
  "ratelimit.redis.address" "redis.address"
  "ratelimit.redis.username" "redis.username"
  "ratelimit.redis.db" "redis.db"
  "ratelimit.redis.passwordFile" "redis.passwordSecret"
  "extproc.tls" "extproc.tls"
  "gatewayExtension" "inferencePools.extensionServer" }}
{{- range $path, $use := $owned }}
{{- $node := $.Values.config }}
{{- $found := true }}
{{- range splitList "." $path }}
{{- if and $found (kindIs "map" $node) (hasKey $node .) }}
{{- $node = index $node . }}
{{- else }}
{{- $found = false }}
{{- end }}
{{- end }}
{{- if $found }}
{{- fail (printf "config.%s is set by the chart; use the chart value %s instead" $path $use) }}
{{- end }}
{{- end }}
{{- range .Values.config.virtualModels }}
{{- if and (kindIs "map" .retry) (hasKey .retry "true") }}
{{- fail (printf "config.virtualModels[%s].retry: quote the key \"on\" (YAML reads a bare on: as true)" (toString .name)) }}
{{- end }}
{{- end }}
{{- $extproc := .Values.extproc }}
{{- if and (eq .Values.mode "scaled") (not .Values.redis.address) }}
{{- fail "mode: scaled shares rate-limit counters and observations through Redis: set redis.address" }}
{{- end }}
{{- if and (eq .Values.mode "serve") (not .Values.redis.address) (or $extproc.autoscaling.enabled (gt (int $extproc.replicas) 1)) }}
{{- fail "more than one serve replica needs shared rate-limit counters: set redis.address (or keep extproc.replicas: 1 without autoscaling)" }}
{{- end }}
{{- if and (or .Values.debug.enabled .Values.debug.pprof) (not .Values.debug.tokenSecret.name) }}
{{- fail "debug.enabled and debug.pprof need debug.tokenSecret.name: the /debug pages on the pod network are served only behind a bearer token" }}
{{- end }}
{{- if and .Values.redis.passwordSecret.name (not .Values.redis.address) }}
{{- fail "redis.passwordSecret is set but redis.address is not" }}
{{- end }}
{{- if and .Values.apiKeys.existingSecret .Values.apiKeys.keys }}
{{- fail "set apiKeys.existingSecret or apiKeys.keys, not both" }}
{{- end }}
{{- if and .Values.policies.existingConfigMap .Values.policies.files }}
{{- fail "set policies.existingConfigMap or policies.files, not both" }}
{{- end }}
{{- if .Values.envoyGateway.enabled }}
{{- $route := .Values.envoyGateway.route }}
{{- if and $route.enabled (not $route.models) }}
{{- fail "envoyGateway.route.enabled needs at least one model in envoyGateway.route.models (or set envoyGateway.route.enabled: false)" }}
{{- end }}
{{- if and $route.enabled (not $route.parentRefs) }}
{{- fail "envoyGateway.route.parentRefs must name the Gateway the route attaches to" }}
{{- end }}
{{- if and (not $route.enabled) (not .Values.envoyGateway.targetRefs) }}
{{- fail "envoyGateway.targetRefs must name the Gateway or HTTPRoutes the filters attach to when envoyGateway.route is disabled" }}
{{- end }}
{{- end }}
{{- with .Values.extproc.tls }}
{{- if and (include "infergate.extprocTLSEnabled" $) (not .secretName) (not .certManager.issuerRef) (not .generate) }}
{{- fail "extproc.tls (mutual TLS on the ext_proc port) needs its certificates: extproc.tls.secretName (a Secret with tls.crt, tls.key and ca.crt), extproc.tls.certManager.issuerRef or extproc.tls.generate: true" }}
{{- end }}
{{- if and (eq (toString .enabled) "true") $.Values.istio.enabled }}
{{- fail "extproc.tls.enabled: true with istio.enabled: Istio's proxies reach infergate through their own mTLS and would not present this client certificate; use istio.peerAuthentication instead" }}
{{- end }}
{{- end }}
{{- if and (eq (toString .Values.xds.tls.enabled) "true") (not (include "infergate.extprocTLSEnabled" .)) }}
{{- fail "xds.tls.enabled: true serves xDS with the ext_proc port's certificates: turn extproc.tls on too" }}
{{- end }}
{{- include "infergate.validateTLSUpgrade" . }}
{{- if and (include "infergate.gatewayExtension" .) (not .Values.envoyGateway.enabled) }}
{{- fail "inferencePools.extensionServer puts each pool's Endpoint Picker after the gate of envoyGateway's EnvoyExtensionPolicy: it needs envoyGateway.enabled" }}
{{- end }}
{{- if include "infergate.gatewayExtension" . }}
{{- range .Values.inferencePools.models }}
{{- $pools := 0 }}
{{- range .pools }}{{ if not .port }}{{ $pools = add1 $pools }}{{ end }}{{ end }}
{{- if gt $pools 1 }}
{{- fail (printf "inferencePools.models %q: with inferencePools.extensionServer a model has one InferencePool (and any Services with a port). Envoy Gateway v1.9.1 gives the InferencePools of one rule a single cluster (a custom backend keeps no filter), which cannot be each pool's picker's; the extension server refuses it" .name) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and (include "infergate.gatewayExtension" .) (eq .Values.mode "scaled") (not (include "infergate.hasVirtualModels" .)) }}
{{- fail "inferencePools.extensionServer in scaled mode is served by the SLA controller, which runs with config.virtualModels: add them, or use mode: serve" }}
{{- end }}
{{- if and .Values.envoyGateway.clientCertificateNamespace (not (and (include "infergate.extprocTLSEnabled" .) .Values.extproc.tls.certManager.issuerRef)) }}
{{- fail "envoyGateway.clientCertificateNamespace issues Envoy's client certificate with cert-manager: it needs extproc.tls.enabled and extproc.tls.certManager.issuerRef" }}
{{- end }}
{{- if and .Values.networkPolicy.enabled (not (include "infergate.extprocPeers" .)) }}
{{- fail "networkPolicy.enabled: no peers for the ext_proc port; set networkPolicy.extprocFrom to select your Envoy pods (the chart derives them only for Envoy Gateway's route.parentRefs Gateways and Istio)" }}
{{- end }}
{{- if and .Values.istio.peerAuthentication.enabled (not .Values.istio.enabled) }}
{{- fail "istio.peerAuthentication needs istio.enabled" }}
{{- end }}
{{- with .Values.istio }}
{{- if and .enabled .peerAuthentication.enabled .authorizationPolicy.enabled }}
{{- if and .gateway.enabled (not .sidecar.gatewayIdentities) }}
{{- fail "istio.authorizationPolicy admits the gateway by istio.sidecar.gatewayIdentities: list the gateway's SPIFFE IDs there (or set istio.authorizationPolicy.enabled: false)" }}
{{- end }}
{{- if and .sidecar.enabled (not .authorizationPolicy.sidecarIdentities) }}
{{- fail "istio.authorizationPolicy admits the model servers' sidecars by istio.authorizationPolicy.sidecarIdentities: list their service accounts' SPIFFE IDs (or set istio.authorizationPolicy.enabled: false)" }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.istio.enabled .Values.istio.sidecar.enabled (not .Values.istio.sidecar.workloadSelector) }}
{{- fail "istio.sidecar.workloadSelector must select the model-server pods (an empty selector would put the filters on every sidecar of the namespace)" }}
{{- end }}
{{- end }}

{{/*
An upgrade of a release whose ext_proc port was plaintext (a chart from
before mutual TLS was the default, or extproc.tls.enabled: false) to the
default "auto", which would turn mutual TLS on: refused with what to do,
since every Envoy without the client certificate would lose the gate (every
request 503). An explicit extproc.tls.enabled, true or false, proceeds.
The same for a plaintext xDS port that served virtual models and
xds.tls.enabled "auto" (an Envoy would keep stale routes).
lookup reads nothing without a cluster (helm template), so renders pass.
*/}}
{{- define "infergate.validateTLSUpgrade" -}}
{{- $fullname := include "infergate.fullname" . }}
{{- $svc := printf "%s.%s.svc.%s" $fullname .Release.Namespace .Values.clusterDomain }}
{{- $previous := dict }}
{{- if .Release.IsUpgrade }}
{{- $cm := lookup "v1" "ConfigMap" .Release.Namespace (printf "%s-config" $fullname) }}
{{- $previous = fromYaml (dig "data" "config.yaml" "" $cm) }}
{{- end }}
{{- if and (eq (toString .Values.extproc.tls.enabled) "auto") (include "infergate.extprocTLSEnabled" .) (dig "extproc" "insecureOpenToNetwork" false $previous) }}
{{- fail (printf "this upgrade would turn on mutual TLS on the ext_proc port, which is now the default for a plain Envoy: an Envoy without the client certificate would lose the gate (every request 503). Either keep plaintext with --set extproc.tls.enabled=false (then guard the port with networkPolicy.enabled), or set extproc.tls.enabled=true and give your Envoy the client certificate: mount Secret %s-envoy-client (tls.crt, tls.key, ca.crt) and use envoy/snippet-mtls.yaml's infergate cluster (SNI and SAN %s); the NOTES after the upgrade repeat this" $fullname $svc) }}
{{- end }}
{{- if and (eq (toString .Values.xds.tls.enabled) "auto") (include "infergate.xdsTLSEnabled" .) (dig "xds" "insecureOpenToNetwork" false $previous) (dig "virtualModels" list $previous) }}
{{- fail (printf "this upgrade would turn on mutual TLS on the xDS port (it follows the ext_proc port's for a plain Envoy): an Envoy fetching the virtual-model routes in plaintext would keep its last routes and never get new weights. Either keep plaintext xDS with --set xds.tls.enabled=false, or set xds.tls.enabled=true and give the xDS cluster of your Envoy (envoy/sla.yaml's infergate-xds) the transport_socket of envoy/snippet-mtls.yaml, with Secret %s-envoy-client's files (SNI and SAN %s)" $fullname $svc) }}
{{- end }}
{{- end }}

{{/*
The configuration file: values.config with the keys the chart owns.
*/}}
{{- define "infergate.config" -}}
{{- /* A pod's ports listen on the pod network, which infergate refuses
  without mTLS or an explicit opt-in: the chart writes one or the other.
  Plaintext ext_proc and xDS are then guarded by the mesh (istio) or the
  NetworkPolicy only. The admin port serves /metrics and the probes there,
  the /debug pages only with a token. */}}
{{- $extproc := dict "listen" (printf ":%d" (int .Values.ports.extproc)) }}
{{- if include "infergate.extprocTLSSecret" . }}
{{- $_ := set $extproc "tls" (dict "certFile" "/etc/infergate/tls/tls.crt" "keyFile" "/etc/infergate/tls/tls.key" "clientCAFile" "/etc/infergate/tls/ca.crt") }}
{{- else }}
{{- $_ := set $extproc "insecureOpenToNetwork" true }}
{{- end }}
{{- $xds := dict "listen" (printf ":%d" (int .Values.ports.xds)) }}
{{- if include "infergate.xdsTLSEnabled" . }}
{{- $_ := set $xds "tls" (dict "certFile" "/etc/infergate/tls/tls.crt" "keyFile" "/etc/infergate/tls/tls.key" "clientCAFile" "/etc/infergate/tls/ca.crt") }}
{{- else }}
{{- $_ := set $xds "insecureOpenToNetwork" true }}
{{- end }}
{{- $admin := dict "listen" (printf ":%d" (int .Values.ports.admin)) "openToNetwork" true }}
{{- if or .Values.debug.enabled .Values.debug.pprof }}
{{- $_ := set $admin "debug" (dict "enabled" .Values.debug.enabled "tokenFile" "/etc/infergate/debug/token") }}
{{- $_ := set $admin "pprof" .Values.debug.pprof }}
{{- end }}
{{- $owned := dict
  "extproc" $extproc
  "admin" $admin
  "xds" $xds }}
{{- if include "infergate.apiKeysSecret" . }}
{{- $_ := set $owned "auth" (dict "keys" "/etc/infergate/keys") }}
{{- end }}
{{- if .Values.policies.enabled }}
{{- $_ := set $owned "policy" (dict "dir" "/etc/infergate/policies") }}
{{- end }}
{{- if include "infergate.gatewayExtension" . }}
{{- $_ := set $owned "gatewayExtension" (dict "enabled" true
  "policy" (dict "namespace" .Release.Namespace "name" (include "infergate.fullname" .))
  "clusterDomain" .Values.clusterDomain
  "endpointPickerTLS" .Values.inferencePools.extensionServer.endpointPickerTLS) }}
{{- end }}
{{- with .Values.redis }}
{{- if .address }}
{{- $redis := dict "address" .address }}
{{- if .username }}{{ $_ := set $redis "username" .username }}{{ end }}
{{- if .db }}{{ $_ := set $redis "db" (int .db) }}{{ end }}
{{- if .passwordSecret.name }}{{ $_ := set $redis "passwordFile" "/etc/infergate/redis/password" }}{{ end }}
{{- $_ := set $owned "ratelimit" (dict "backend" "redis" "redis" $redis) }}
{{- end }}
{{- end }}
{{- if include "infergate.embeddedLedger" . }}
{{- $_ := set $owned "ratelimit" (dict "backend" "embedded" "embedded" (dict "path" "/var/lib/infergate/ledger.db")) }}
{{- end }}
{{- toYaml (mustMergeOverwrite (deepCopy .Values.config) $owned) }}
{{- end }}

{{/*
The pod template shared by the ext_proc and controller Deployments. Call with
(dict "root" $ "component" NAME "args" LIST "extproc" BOOL "xds" BOOL
"mountPolicy" BOOL "settings" .Values.extproc|.Values.controller).
*/}}
{{- define "infergate.podTemplate" -}}
{{- $root := .root }}
{{- $v := $root.Values -}}
metadata:
  labels:
    {{- include "infergate.componentSelectorLabels" (dict "root" $root "component" .component) | nindent 4 }}
    {{- with $v.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    # The config is read once at start: roll the pods when it changes.
    # Policies and API keys are not here on purpose: infergate reloads them
    # in place, without dropping streams.
    checksum/config: {{ include "infergate.config" $root | sha256sum }}
    {{- with $v.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "infergate.serviceAccountName" $root }}
  {{- if and (or (include "infergate.weightSinkObject" $root) (ne (include "infergate.followedInferencePools" $root) "{}")) (or .xds (not .extproc)) }}
  # The SLA controller writes its weights (config.weightSink) or follows
  # InferencePools' pods (pools[].inferencePool) through the Kubernetes
  # API: it needs the service account's token.
  automountServiceAccountToken: true
  {{- else if and (include "infergate.gatewayExtension" $root) .xds }}
  # Envoy Gateway's extension reads HTTPRoutes through the Kubernetes API:
  # it needs the service account's token.
  automountServiceAccountToken: true
  {{- else }}
  # infergate does not call the Kubernetes API.
  automountServiceAccountToken: false
  {{- end }}
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  terminationGracePeriodSeconds: {{ .settings.terminationGracePeriodSeconds }}
  securityContext:
    {{- toYaml $v.podSecurityContext | nindent 4 }}
  containers:
  - name: infergate
    image: {{ include "infergate.image" $root | quote }}
    imagePullPolicy: {{ $v.image.pullPolicy }}
    args:
    {{- range .args }}
    - {{ . | quote }}
    {{- end }}
    ports:
    {{- if .extproc }}
    - {name: extproc, containerPort: {{ $v.ports.extproc }}, protocol: TCP}
    {{- end }}
    - {name: admin, containerPort: {{ $v.ports.admin }}, protocol: TCP}
    {{- if .xds }}
    - {name: xds, containerPort: {{ $v.ports.xds }}, protocol: TCP}
    {{- end }}
    {{- with .settings.resources.limits }}
    {{- if .memory }}
    env:
    # Let the Go runtime collect harder before the container's memory limit
    # is reached, instead of being OOM-killed.
    - name: GOMEMLIMIT
      valueFrom:
        resourceFieldRef: {resource: limits.memory, divisor: "1"}
    {{- end }}
    {{- end }}
    livenessProbe:
      httpGet: {path: /healthz, port: admin}
      {{- toYaml $v.probes.liveness | nindent 6 }}
    readinessProbe:
      httpGet: {path: /readyz, port: admin}
      {{- toYaml $v.probes.readiness | nindent 6 }}
    {{- if .settings.preStopSleepSeconds }}
    lifecycle:
      preStop:
        sleep: {seconds: {{ .settings.preStopSleepSeconds }}}
    {{- end }}
    resources:
      {{- toYaml .settings.resources | nindent 6 }}
    securityContext:
      {{- toYaml $v.securityContext | nindent 6 }}
    volumeMounts:
    - {name: config, mountPath: /etc/infergate/config.yaml, subPath: config.yaml, readOnly: true}
    {{- if and .mountPolicy (include "infergate.policiesConfigMap" $root) }}
    - {name: policies, mountPath: /etc/infergate/policies, readOnly: true}
    {{- end }}
    {{- if and .mountPolicy (include "infergate.apiKeysSecret" $root) }}
    - {name: apikeys, mountPath: /etc/infergate/keys, readOnly: true}
    {{- end }}
    {{- if $v.redis.passwordSecret.name }}
    - {name: redis-password, mountPath: /etc/infergate/redis, readOnly: true}
    {{- end }}
    {{- if or $v.debug.enabled $v.debug.pprof }}
    # A directory, not a subPath: a rotated token reaches the running process.
    - {name: debug-token, mountPath: /etc/infergate/debug, readOnly: true}
    {{- end }}
    {{- if or (and .extproc (include "infergate.extprocTLSSecret" $root)) (and .xds (include "infergate.xdsTLSEnabled" $root)) }}
    # A directory, not subPaths: a renewed certificate reaches the running
    # process, which reloads it for new handshakes.
    - {name: extproc-tls, mountPath: /etc/infergate/tls, readOnly: true}
    {{- end }}
    {{- if and .extproc (include "infergate.embeddedLedger" $root) }}
    - {name: ledger, mountPath: /var/lib/infergate}
    {{- end }}
    - {name: tmp, mountPath: /tmp}
  volumes:
  - name: config
    configMap: {name: {{ include "infergate.fullname" $root }}-config}
  {{- if and .mountPolicy (include "infergate.policiesConfigMap" $root) }}
  - name: policies
    configMap: {name: {{ include "infergate.policiesConfigMap" $root }}}
  {{- end }}
  {{- if and .mountPolicy (include "infergate.apiKeysSecret" $root) }}
  - name: apikeys
    secret: {secretName: {{ include "infergate.apiKeysSecret" $root }}, defaultMode: 0440}
  {{- end }}
  {{- with $v.redis.passwordSecret }}
  {{- if .name }}
  - name: redis-password
    secret:
      secretName: {{ .name }}
      defaultMode: 0440
      items: [{key: {{ .key }}, path: password}]
  {{- end }}
  {{- end }}
  {{- if or $v.debug.enabled $v.debug.pprof }}
  - name: debug-token
    secret:
      secretName: {{ $v.debug.tokenSecret.name }}
      defaultMode: 0440
      items: [{key: {{ $v.debug.tokenSecret.key }}, path: token}]
  {{- end }}
  {{- if or (and .extproc (include "infergate.extprocTLSSecret" $root)) (and .xds (include "infergate.xdsTLSEnabled" $root)) }}
  - name: extproc-tls
    secret:
      secretName: {{ include "infergate.extprocTLSSecret" $root }}
      defaultMode: 0440
      items: [{key: tls.crt, path: tls.crt}, {key: tls.key, path: tls.key}, {key: ca.crt, path: ca.crt}]
  {{- end }}
  {{- if and .extproc (include "infergate.embeddedLedger" $root) }}
  - name: ledger
    {{- if $v.ledger.persistence.enabled }}
    persistentVolumeClaim: {claimName: {{ include "infergate.ledgerClaim" $root }}}
    {{- else }}
    emptyDir: {}
    {{- end }}
  {{- end }}
  # The root filesystem is read-only; Go and OPA may still want a scratch dir.
  - name: tmp
    emptyDir: {sizeLimit: 64Mi}
  {{- with $v.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/*
"true" when the money is kept in the embedded ledger: mode serve without
redis.address.
*/}}
{{- define "infergate.embeddedLedger" -}}
{{- if and (eq .Values.mode "serve") (not .Values.redis.address) }}true{{ end }}
{{- end }}

{{/*
The ledger's claim: the existing one, or the chart's.
*/}}
{{- define "infergate.ledgerClaim" -}}
{{- .Values.ledger.persistence.existingClaim | default (printf "%s-ledger" (include "infergate.fullname" .)) }}
{{- end }}

{{/*
"true" when the ledger's volume can be mounted by one pod at a time, so a
rollout must stop the old pod first.
*/}}
{{- define "infergate.ledgerRecreate" -}}
{{- with .Values.ledger.persistence }}
{{- if and (include "infergate.embeddedLedger" $) .enabled (or .existingClaim (eq .accessMode "ReadWriteOnce") (eq .accessMode "ReadWriteOncePod")) }}true{{ end }}
{{- end }}
{{- end }}
