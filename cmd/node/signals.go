package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// signals are the node's two stop signals: the first SIGINT or SIGTERM
// ends stop (the node drains, then stops), the second ends now (it stops
// at once: the rest of the drain is skipped and calls in flight are cut).
// Later ones are ignored until release.
type signals struct {
	stop, now context.Context
	release   func() // stops listening; call once, on the way out
}

// stopSignal is the cause of a signals context that a signal ended.
type stopSignal struct{ sig os.Signal }

func (s stopSignal) Error() string { return signalName(s.sig) }

// notifySignals starts listening for SIGINT and SIGTERM. onSecond runs on
// the second signal before now ends, so what it logs comes before the
// node's last lines.
func notifySignals(onSecond func(os.Signal)) signals {
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	stop, cancelStop := context.WithCancelCause(context.Background())
	now, cancelNow := context.WithCancelCause(context.Background())
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := range 2 {
			select {
			case s := <-ch:
				if i == 0 {
					cancelStop(stopSignal{s})
				} else {
					onSecond(s)
					cancelNow(stopSignal{s})
				}
			case <-quit:
				return
			}
		}
	}()
	return signals{stop: stop, now: now, release: func() {
		close(quit)
		<-done
		signal.Stop(ch)
		cancelStop(nil)
		cancelNow(nil)
	}}
}

// signalOf is the signal that ended ctx, or "" if none did.
func signalOf(ctx context.Context) string {
	if s, ok := context.Cause(ctx).(stopSignal); ok {
		return s.Error()
	}
	return ""
}

func signalName(s os.Signal) string {
	switch s {
	case os.Interrupt:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return s.String()
}
