package tunnel

import (
	"io"
	"testing"
)

// BenchmarkStreamThroughput pushes data hub -> agent over one stream on
// loopback; go test reports MB/s from SetBytes.
func BenchmarkStreamThroughput(b *testing.B) {
	const chunk = 64 << 10
	for _, tr := range transports {
		b.Run(tr.String(), func(b *testing.B) {
			agent, hub := pair(b, tr, nil)
			w, r := openPair(b, hub, agent)
			drained := make(chan error, 1)
			go func() {
				_, err := io.Copy(io.Discard, r)
				drained <- err
			}()
			buf := make([]byte, chunk)
			b.SetBytes(chunk)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if _, err := w.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			if err := w.CloseWrite(); err != nil {
				b.Fatal(err)
			}
			if err := <-drained; err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
		})
	}
}
