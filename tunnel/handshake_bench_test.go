package tunnel

import (
	"context"
	"crypto/tls"
	"syscall"
	"testing"
	"time"
)

// cpuTime is this process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHandshake measures what a returning agent costs: a full
// handshake against one resumed from a session ticket, per transport. The
// hub and the agent run in this process, so cpu-µs/op is both sides
// together; each session carries one stream round trip (which delivers the
// ticket) in both cases.
func BenchmarkHandshake(b *testing.B) {
	key := [32]byte{7}
	for _, tr := range transports {
		for _, resume := range []bool{false, true} {
			name := tr.String() + "/full"
			if resume {
				name = tr.String() + "/resumed"
			}
			b.Run(name, func(b *testing.B) {
				l, err := Listen(b.Context(), "127.0.0.1:0", ListenConfig{TunnelTLS: tunnelServerTLS(), StatelessResetKey: &key})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				tc := clientTLS(true)
				if resume {
					tc.ClientSessionCache = tls.NewLRUClientSessionCache(4)
				}
				once := func() bool {
					ctx, cancel := context.WithTimeout(b.Context(), 10*time.Second)
					defer cancel()
					agent, err := (&Dialer{TLSConfig: tc, Transport: tr}).Dial(ctx, l.Addr().String())
					if err != nil {
						b.Fatal(err)
					}
					defer agent.Close()
					hub, err := l.Accept(ctx)
					if err != nil {
						b.Fatal(err)
					}
					defer hub.Close()
					a, h := openPair(b, agent, hub)
					_, _ = h.Write([]byte("x"))
					_, _ = a.Read(make([]byte, 1))
					return agent.ConnectionState().DidResume
				}
				if resume {
					once() // the first session fetches the ticket
				}
				cpu0 := cpuTime()
				b.ResetTimer()
				resumed := 0
				for range b.N {
					if once() {
						resumed++
					}
				}
				b.StopTimer()
				b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
				if resume && resumed != b.N {
					b.Fatalf("%d of %d sessions resumed", resumed, b.N)
				}
			})
		}
	}
}
