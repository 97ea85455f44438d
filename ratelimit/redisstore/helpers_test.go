package redisstore

import (
	"fmt"
	"math"
	"strconv"
)

func itoa(n int64) string                      { return strconv.FormatInt(n, 10) }
func log2(x float64) float64                   { return math.Log2(x) }
func fmtSscan(s string, v ...any) (int, error) { return fmt.Sscan(s, v...) }
