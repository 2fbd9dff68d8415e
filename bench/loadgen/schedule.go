package loadgen

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Arrival is the inter-arrival process of an open-loop run.
type Arrival string

// Arrival processes. Gamma with shape 1 is Poisson; below 1 it is burstier,
// above 1 smoother, and as the shape grows it tends to Constant.
const (
	Constant Arrival = "constant"
	Poisson  Arrival = "poisson"
	Gamma    Arrival = "gamma"
)

// RNG streams: each consumer of the seed draws from its own stream, so a
// change to the workload never shifts the arrival schedule and vice versa.
const (
	streamSchedule uint64 = 0x5c4ed01e
	streamItem     uint64 = 0x17e40000
	streamPrefix   uint64 = 0x9e3779b9
	streamStats    uint64 = 0xb0075742
)

// Schedule generates the intended send times of an open-loop run, as
// offsets from the run's start. It is deterministic for a given seed.
//
// Arrivals are drawn as a unit-rate renewal process (gaps with mean 1: all
// equal for Constant, exponential for Poisson, gamma(shape, 1/shape) for
// Gamma) and mapped through the inverse of the cumulative rate Λ(t), so a
// linear ramp from 0 to the rate changes the density of arrivals without
// changing the process's shape. Unlike vLLM, the draws are not rescaled to
// land the last request at exactly N/rate: the statistics stay those of the
// named process.
type Schedule struct {
	rate  float64 // arrivals per second once the ramp is over
	ramp  float64 // seconds of linear ramp from 0 to rate
	shape float64 // gamma shape; 0 for Constant
	rng   *rand.Rand
	unit  float64 // Λ of the last arrival (unit-rate time)
}

// NewSchedule returns the schedule for rate arrivals per second. burstiness
// is the gamma shape (ignored unless arrival is Gamma); ramp, if positive,
// raises the rate linearly from 0 over that time.
func NewSchedule(arrival Arrival, rate, burstiness float64, ramp time.Duration, seed int64) (*Schedule, error) {
	if !(rate > 0) || math.IsInf(rate, 0) {
		return nil, fmt.Errorf("loadgen: rate must be positive, got %g", rate)
	}
	s := &Schedule{rate: rate, ramp: max(ramp.Seconds(), 0), rng: rand.New(rand.NewPCG(uint64(seed), streamSchedule))}
	switch arrival {
	case Constant:
	case Poisson, "":
		s.shape = 1
	case Gamma:
		if !(burstiness > 0) || math.IsInf(burstiness, 0) {
			return nil, fmt.Errorf("loadgen: burstiness (gamma shape) must be positive, got %g", burstiness)
		}
		s.shape = burstiness
	default:
		return nil, fmt.Errorf("loadgen: unknown arrival %q (want constant, poisson or gamma)", arrival)
	}
	return s, nil
}

// Next returns the offset of the next arrival.
func (s *Schedule) Next() time.Duration {
	gap := 1.0
	if s.shape > 0 {
		gap = gammaVariate(s.rng, s.shape) / s.shape
	}
	s.unit += gap
	return time.Duration(s.invert(s.unit) * float64(time.Second))
}

// invert returns the time t at which Λ(t) = u, where Λ is the integral of
// the rate: r·t²/(2T) during a ramp of T seconds, then linear.
func (s *Schedule) invert(u float64) float64 {
	if s.ramp == 0 {
		return u / s.rate
	}
	rampUnits := s.rate * s.ramp / 2
	if u <= rampUnits {
		return math.Sqrt(2 * s.ramp * u / s.rate)
	}
	return s.ramp + (u-rampUnits)/s.rate
}

// gammaVariate draws from gamma(shape, 1) with Marsaglia and Tsang's
// method; shapes below 1 use the boost gamma(a) = gamma(a+1)·U^(1/a).
func gammaVariate(rng *rand.Rand, shape float64) float64 {
	if shape == 1 {
		return rng.ExpFloat64()
	}
	boost := 1.0
	if shape < 1 {
		boost = math.Pow(1-rng.Float64(), 1/shape) // 1-U avoids U = 0
		shape++
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := rng.Float64()
		if u < 1-0.0331*x*x*x*x || math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v * boost
		}
	}
}
