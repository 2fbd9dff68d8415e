package openai

import "testing"

func BenchmarkTmpParseTools(b *testing.B) {
	b.SetBytes(int64(len(toolsBody)))
	for b.Loop() {
		if _, err := ParseRequest(toolsBody); err != nil {
			b.Fatal(err)
		}
	}
}
