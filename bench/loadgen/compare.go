package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"

	"github.com/infergate/infergate/bench/result"
	"github.com/infergate/infergate/internal/stats"
)

// Bootstrap settings for the mean's confidence interval. The seed is fixed
// so a report is reproducible; past maxBootstrapWork draws the normal
// approximation is used (the sample is then far too large for it to
// matter).
const (
	bootstrapResamples = 1000
	maxBootstrapWork   = 50_000_000
	deltaBins          = 40
)

// Compare pairs target a's and b's measured requests by workload item (both
// got the same request, back to back) and summarises the differences
// b − a of the pairs where both succeeded.
func (rec *Recording) Compare(a, b int) result.Compare {
	byItem := make(map[int]*Sample, len(rec.Samples[a]))
	for k := range rec.Samples[a] {
		if s := &rec.Samples[a][k]; s.Phase == Measure && s.OK() {
			byItem[s.Item] = s
		}
	}
	var dTTFT, dITL, dE2E []float64
	for k := range rec.Samples[b] {
		sb := &rec.Samples[b][k]
		sa, ok := byItem[sb.Item]
		if sb.Phase != Measure || !sb.OK() || !ok {
			continue
		}
		dTTFT = append(dTTFT, stats.Ms(sb.TTFT-sa.TTFT))
		dE2E = append(dE2E, stats.Ms(sb.E2E-sa.E2E))
		ga, okA := sa.MeanGap()
		gb, okB := sb.MeanGap()
		if okA && okB {
			dITL = append(dITL, stats.Ms(gb-ga))
		}
	}
	return result.Compare{
		A:           rec.Targets[a].Name,
		B:           rec.Targets[b].Name,
		Pairs:       len(dTTFT),
		DeltaTTFTMs: summarizeDelta(dTTFT),
		DeltaITLMs:  summarizeDelta(dITL),
		DeltaE2EMs:  summarizeDelta(dE2E),
	}
}

// summarizeDelta sorts d in place and describes it.
func summarizeDelta(d []float64) result.Delta {
	n := len(d)
	if n == 0 {
		return result.Delta{Edges: []float64{}, Counts: []int{}}
	}
	slices.Sort(d)
	sum := 0.0
	for _, v := range d {
		sum += v
	}
	out := result.Delta{
		N:    n,
		Mean: sum / float64(n),
		P50:  median(d),
		P90:  stats.Percentile(d, 0.90),
		P99:  stats.Percentile(d, 0.99),
		Min:  d[0],
		Max:  d[n-1],
	}
	out.MeanCI95 = meanCI(d, out.Mean)
	out.P50CI95 = medianCI(d)
	out.Edges, out.Counts = histogram(d)
	return out
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// meanCI is the 95% percentile-bootstrap interval of the mean.
func meanCI(d []float64, mean float64) [2]float64 {
	n := len(d)
	if n < 2 {
		return [2]float64{mean, mean}
	}
	if n*bootstrapResamples > maxBootstrapWork {
		sd := 0.0
		for _, v := range d {
			sd += (v - mean) * (v - mean)
		}
		half := 1.96 * math.Sqrt(sd/float64(n-1)/float64(n))
		return [2]float64{mean - half, mean + half}
	}
	rng := rand.New(rand.NewPCG(uint64(n), streamStats))
	means := make([]float64, bootstrapResamples)
	for i := range means {
		s := 0.0
		for range n {
			s += d[rng.IntN(n)]
		}
		means[i] = s / float64(n)
	}
	slices.Sort(means)
	return [2]float64{means[int(0.025*bootstrapResamples)], means[int(0.975*bootstrapResamples)-1]}
}

// medianCI is the distribution-free confidence interval of the median from
// order statistics: the narrowest [x(j), x(n−1−j)] that covers the median
// with probability at least 95% whatever the distribution. Below 6 values
// no interval reaches 95% and [min, max] is returned.
func medianCI(sorted []float64) [2]float64 {
	n := len(sorted)
	if n < 6 {
		return [2]float64{sorted[0], sorted[n-1]}
	}
	// j is the 0-based index of the lower bound: the largest with
	// P(B ≤ j) ≤ 2.5%, as the median is below x[j] only if at most j values are.
	var j int
	if n <= 1000 {
		pmf := math.Pow(0.5, float64(n)) // P(B = 0)
		cdf := pmf
		for cdf+pmf*float64(n-j)/float64(j+1) <= 0.025 {
			pmf *= float64(n-j) / float64(j+1)
			cdf += pmf
			j++
		}
	} else {
		j = max(int(math.Floor(float64(n)/2-0.98*math.Sqrt(float64(n))))-1, 0)
	}
	return [2]float64{sorted[j], sorted[n-1-j]}
}

// histogram bins sorted over [p1, p99] in deltaBins equal bins; values
// beyond fall in the end bins. It returns the lower edges and the counts.
func histogram(sorted []float64) ([]float64, []int) {
	lo, hi := stats.Percentile(sorted, 0.01), stats.Percentile(sorted, 0.99)
	if hi <= lo {
		return []float64{lo}, []int{len(sorted)}
	}
	width := (hi - lo) / deltaBins
	edges := make([]float64, deltaBins)
	counts := make([]int, deltaBins)
	for i := range edges {
		edges[i] = lo + float64(i)*width
	}
	for _, v := range sorted {
		counts[min(max(int((v-lo)/width), 0), deltaBins-1)]++
	}
	return edges, counts
}
