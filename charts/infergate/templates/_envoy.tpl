{{/*
The gate and meter ext_proc filters as raw Envoy config, for the Istio
EnvoyFilters. The same filters as envoy/snippet.yaml (see the comments
there); a test keeps them identical apart from the cluster name, the
message timeout and the error status. Call with (dict "root" $ "cluster" NAME).
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
  metadata_options:
    receiving_namespaces: {untyped: [infergate]}
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
  request_attributes: [request.time]
  response_attributes: [response.code, upstream.address, xds.cluster_name, xds.cluster_metadata, upstream.request_attempt_count]
  metadata_options:
    forwarding_namespaces: {untyped: [infergate]}
{{- end }}
