{{/*
The gate and meter ext_proc filters as raw Envoy config, for the Istio
EnvoyFilters. The same filters as envoy/snippet.yaml (see the comments
there); a test keeps them identical apart from the cluster name, the
message timeout, the error status and the gate's forwarded headers, which
also name config.auth.policyHeaders (a header the gate is not sent, no
policy sees). Call with (dict "root" $ "cluster" NAME).
*/}}

{{- define "infergate.envoy.gate" -}}
name: infergate.gate
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
  grpc_service:
    envoy_grpc: {cluster_name: {{ .cluster | quote }}}
    initial_metadata: [{key: x-infergate-filter, value: gate}]
  failure_mode_allow: false
  status_on_error: {code: {{ .root.Values.filters.gate.statusOnError }}}
  message_timeout: {{ .root.Values.filters.gate.messageTimeout }}
  processing_mode:
    request_header_mode: SEND
    request_body_mode: STREAMED
    response_header_mode: SKIP
    response_body_mode: NONE
  send_body_without_waiting_for_header_response: true
  forward_rules:
    allowed_headers:
      patterns:
      {{- $headers := list ":method" ":path" "content-type" "x-request-id" "authorization" "x-api-key" "user-agent" }}
      {{- range $headers }}
      - {exact: {{ . | quote }}}
      {{- end }}
      {{- range (dig "auth" "policyHeaders" list .root.Values.config) }}
      {{- if not (has (lower .) $headers) }}
      - {exact: {{ lower . | quote }}}
      {{- end }}
      {{- end }}
      - {prefix: x-infergate-}
      - {prefix: x_infergate_}
  metadata_options:
    receiving_namespaces: {untyped: [infergate, infergate.meter]}
    forwarding_namespaces: {untyped: [envoy.filters.http.jwt_authn]}
{{- end }}

{{- define "infergate.envoy.meter" -}}
name: infergate.meter
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
  grpc_service:
    envoy_grpc: {cluster_name: {{ .cluster | quote }}}
    initial_metadata: [{key: x-infergate-filter, value: meter}]
  observability_mode: true
  failure_mode_allow: true
  deferred_close_timeout: 5s
  processing_mode:
    request_header_mode: SEND
    response_header_mode: SEND
    response_body_mode: STREAMED
  request_attributes:
  - "metadata.filter_metadata['infergate.meter']['m']"
  - request.time
  response_attributes:
  - response.code
  - upstream.address
  - xds.cluster_name
  - "xds.cluster_metadata.filter_metadata['infergate']['pool_order']"
  - upstream.request_attempt_count
  - response.code_details
  forward_rules:
    allowed_headers:
      patterns:
      - {exact: x-request-id}
      - {exact: x-infergate-model}
      - {exact: x-gateway-destination-endpoint} # an Endpoint Picker's choice, for the stamp
      - {exact: ":status"}
      - {exact: content-type}
      - {exact: x-infergate-pool}
{{- end }}

{{/*
envoy/snippet.yaml's infergate.usage: on a stream whose usage the gate asked
for on the client's behalf (metadata infergate.usage_added), removes the
pool's usage-only event after the meter, the next filter, has read it. The
script is files/usage.lua, byte for byte the snippet's (a test keeps them
identical); the Envoy Gateway policy reads the same file.
*/}}
{{- define "infergate.envoy.usage" -}}
name: infergate.usage
typed_config:
  "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
  default_source_code:
    inline_string: |
      {{- .root.Files.Get "files/usage.lua" | trimSuffix "\n" | nindent 6 }}
{{- end }}

{{/*
The gate's failures in OpenAI's error format: envoy/snippet.yaml's first
local-reply mapper (a test keeps them identical). Only replies the ext_proc
filter made: a mesh's other local replies are left as they are.
*/}}
{{- define "infergate.envoy.localReply" -}}
mappers:
- filter:
    extension_filter:
      name: envoy.access_loggers.extension_filters.cel
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter
        expression: "!('x-infergate-error' in response.headers) && response.code_details.startsWith('ext_proc')"
  body_format_override:
    json_format:
      error:
        message: "the gateway's request filter is unavailable; the request was not forwarded"
        type: "gateway_error"
        param: null
        code: "gate_unavailable"
    content_type: application/json
{{- end }}
