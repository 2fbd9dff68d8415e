package cli

import "github.com/infergate/infergate/internal/compose"

// A binary built without the Makefile's -X stamp (`go install
// github.com/infergate/infergate/cmd/infergate@v0.1.0`) still knows its
// version: the module version the go command recorded in the build info.
func init() { Version = compose.BuildVersion(Version) }
