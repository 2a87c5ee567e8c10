package faultproxy

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// echo starts a line echo server.
func echo(t *testing.T) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					l, err := r.ReadString('\n')
					if err != nil {
						return
					}
					c.Write([]byte(l))
				}
			}()
		}
	}()
	return lis.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, deadline time.Duration) error {
	c.SetDeadline(time.Now().Add(deadline))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	_, err := bufio.NewReader(c).ReadString('\n')
	return err
}

func TestFaults(t *testing.T) {
	p := New(t, echo(t))
	c, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, roundTrip(t, c, 5*time.Second))

	p.SetLatency(50 * time.Millisecond)
	start := time.Now()
	require.NoError(t, roundTrip(t, c, 5*time.Second))
	require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond, "latency is added each way")

	p.Heal()
	p.BlackHole(true)
	require.Error(t, roundTrip(t, c, 200*time.Millisecond), "a black hole never answers")

	p.Heal()
	p.Cut()
	c2, err := net.Dial("tcp", p.Addr)
	if err == nil {
		require.Error(t, roundTrip(t, c2, 2*time.Second), "a cut proxy refuses")
		c2.Close()
	}
	p.Heal()
	c3, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer c3.Close()
	require.NoError(t, roundTrip(t, c3, 5*time.Second))
}

func TestAdmitFirstLine(t *testing.T) {
	p := New(t, echo(t))
	p.AdmitFirstLine(func(line []byte) bool { return string(line) == "hello\n" })

	ok, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer ok.Close()
	ok.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = ok.Write([]byte("hello\n"))
	require.NoError(t, err)
	r := bufio.NewReader(ok)
	l, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "hello\n", l, "an admitted first line is forwarded")
	_, err = ok.Write([]byte("ping\n"))
	require.NoError(t, err)
	l, err = r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "ping\n", l, "and so is the rest")

	bad, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer bad.Close()
	bad.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = bad.Write([]byte("intruder\n"))
	require.NoError(t, err)
	_, err = bufio.NewReader(bad).ReadString('\n')
	require.Error(t, err, "a rejected connection is closed, nothing echoed")
}
