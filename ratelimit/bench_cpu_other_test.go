//go:build !unix

package ratelimit_test

import "time"

// processCPU is not measured on this platform; cpu-ns/op reads 0.
func processCPU() time.Duration { return 0 }
