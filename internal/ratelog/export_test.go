package ratelog

import "log/slog"

// Tracked is how many (message, level) pairs log's limits hold.
func Tracked(log *slog.Logger) int {
	st := log.Handler().(*handler).st
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.seen)
}
