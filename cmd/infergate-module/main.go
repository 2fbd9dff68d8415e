// Command infergate-module is infergate's gate and meter as an Envoy
// dynamic module: a shared library (go build -buildmode=c-shared -o
// libinfergate.so, make module) that Envoy loads and calls in its own
// process. Its filter (filter_name "infergate") takes the path of an
// infergate configuration file as its filter config (envoy/snippet-module.yaml).
// Envoy must run with GODEBUG=cgocheck=0.
package main

import (
	sdk "github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go"
	_ "github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/abi" // the C ABI Envoy calls
	"github.com/envoyproxy/envoy/source/extensions/dynamic_modules/sdk/go/shared"

	"github.com/infergate/infergate/internal/compose"
	"github.com/infergate/infergate/module"
)

func init() {
	sdk.RegisterHttpFilterConfigFactories(map[string]shared.HttpFilterConfigFactory{
		module.FilterName: module.NewConfigFactory(compose.ModuleOptions),
	})
}

func main() {}
