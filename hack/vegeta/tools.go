//go:build tools

// Package tools pins the vegeta command for hack/build-controlplane.sh.
package tools

import _ "github.com/tsenart/vegeta/v12"
