package cli

import "runtime/debug"

// A binary built without the Makefile's -X stamp (`go install
// github.com/infergate/infergate/cmd/infergate@v0.1.0`) still knows its
// version: the module version the go command recorded in the build info.
func init() {
	if Version != "dev" {
		return
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Path == "github.com/infergate/infergate" &&
		bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		Version = bi.Main.Version
	}
}
