package store

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel/control"
)

// BenchmarkJoin: joins (token check and spend + node insert, one
// transaction) from 16 goroutines per core, on each backend.
func BenchmarkJoin(b *testing.B) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			ctx := context.Background()
			s, err := be.open(ctx, be.newLoc(b))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if err := s.CreateToken(ctx, Token{
				ID:         "t",
				SecretHash: []byte("h"),
				UsesLeft:   1 << 30,
				ExpiresAt:  time.Now().Add(time.Hour),
			}); err != nil {
				b.Fatal(err)
			}
			var seq atomic.Int64
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := seq.Add(1)
					if _, err := s.Join(ctx, "t", accept, Node{ID: fmt.Sprint("id", i), Name: fmt.Sprint("n", i)}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkHello: the store's share of an agent's hello (read the node,
// mark it online, record its facts) for 1000 nodes, 16 goroutines per core.
func BenchmarkHello(b *testing.B) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			ctx := context.Background()
			s, err := be.open(ctx, be.newLoc(b))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			s.CreateToken(ctx, Token{ID: "t", SecretHash: []byte("h"), UsesLeft: 1 << 30, ExpiresAt: time.Now().Add(time.Hour)})
			const nodes = 1000
			for i := range nodes {
				if _, err := s.Join(ctx, "t", accept, Node{ID: fmt.Sprint("id", i), Name: fmt.Sprint("n", i)}); err != nil {
					b.Fatal(err)
				}
			}
			facts := control.Facts{Hostname: "edge", OS: "Debian GNU/Linux 12", Arch: "amd64"}
			var seq atomic.Int64
			b.SetParallelism(16)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					id := fmt.Sprint("id", seq.Add(1)%nodes)
					if _, err := s.GetNode(ctx, id); err != nil {
						b.Error(err)
						return
					}
					if err := s.UpdateNodeSeen(ctx, id, Seen{
						Online:       true,
						Transport:    "quic",
						AgentVersion: "v1",
						At:           time.Now(),
					}); err != nil {
						b.Error(err)
						return
					}
					if err := s.SetNodeFacts(ctx, id, facts); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
