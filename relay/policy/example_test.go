package policy_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluice-relay/sluice/ratelimit"
	"github.com/sluice-relay/sluice/relay/policy"
	"github.com/sluice-relay/sluice/relay/wire"
)

// A Config is a value: its zero value is the defaults, and Validate names
// every field it refuses by its path.
func ExampleConfig_Validate() {
	limits := policy.DefaultLimits()
	limits.Message[wire.TypeEVENT] = []ratelimit.Limit{ratelimit.PerPeriod(0, time.Second)}
	cfg := policy.Config{
		Limits: &limits,
		Tiers:  []policy.Tier{{Name: "members", Pubkeys: []string{"not a pubkey"}}},
	}
	err := cfg.Validate()
	var fe *policy.FieldError
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		if errors.As(e, &fe) {
			fmt.Println(fe.Path)
		}
	}
	fmt.Println(errors.Is(err, ratelimit.ErrInvalidLimit))

	var zero policy.Config
	fmt.Println(zero.Validate() == nil)
	// Output:
	// Limits.Message[EVENT][0]
	// Tiers[0].Pubkeys[0]
	// true
	// true
}
