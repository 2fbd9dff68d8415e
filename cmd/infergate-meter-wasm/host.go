//go:build !wasip1

// The module builds only for wasip1 (make wasm); on the host this stub
// keeps the package visible to go vet, go list and the linters.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "infergate-meter-wasm is a proxy-wasm module: build it with GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared (make wasm)")
	os.Exit(2)
}
