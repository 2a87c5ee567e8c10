package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/policy"
	"github.com/allot-dev/allot/problem"
)

// Problem types of the admin API. They name sections of docs/policies.md.
const (
	TypeInvalid  = "https://github.com/allot-dev/allot/blob/main/docs/policies.md#invalid-policy"
	TypeConflict = "https://github.com/allot-dev/allot/blob/main/docs/policies.md#version-conflict"
)

// Problem is an admin API error: an RFC 9457 problem document (the
// members shared with every Allot HTTP answer, from package problem) plus
// Errors, every problem of a rejected policy or set.
type Problem struct {
	problem.Details
	Errors []FieldError `json:"errors,omitempty"`
}

// FieldError is one validation problem: the policy (empty for file-level
// settings or a body that did not decode), the field and what is wrong.
type FieldError struct {
	Policy  string `json:"policy"`
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Error makes a Problem an error for clients: title, detail and each
// problem on its own line.
func (p *Problem) Error() string {
	s := fmt.Sprintf("%d %s", p.Status, p.Title)
	if p.Detail != "" {
		s += ": " + p.Detail
	}
	for _, e := range p.Errors {
		s += "\n  " + e.String()
	}
	return s
}

func (e FieldError) String() string {
	switch {
	case e.Policy != "" && e.Field != "":
		return fmt.Sprintf("policy %q: %s: %s", e.Policy, e.Field, e.Message)
	case e.Policy != "":
		return fmt.Sprintf("policy %q: %s", e.Policy, e.Message)
	case e.Field != "":
		return e.Field + ": " + e.Message
	}
	return e.Message
}

func statusProblem(code int, detail string) *Problem {
	return &Problem{Details: *problem.Status(code, detail)}
}

func badRequest(detail string, errs ...FieldError) *Problem {
	p := statusProblem(http.StatusBadRequest, detail)
	p.Errors = errs
	return p
}

// invalid describes a rejected policy or set with every problem.
func invalid(ve *policy.ValidationError) *Problem {
	p := statusProblem(http.StatusBadRequest, fmt.Sprintf("the resulting policy set is invalid (%d problems)", len(ve.Problems)))
	p.Type, p.Title = TypeInvalid, "Invalid policy"
	for _, pr := range ve.Problems {
		p.Errors = append(p.Errors, FieldError{Policy: pr.Policy, Field: pr.Field, Message: pr.Msg})
	}
	return p
}

// fromError maps a store or validation error to a problem; the one place
// admin turns errors into HTTP answers.
func (s *Server) fromError(r *http.Request, err error) *Problem {
	var (
		ve *policy.ValidationError
		ce *policystore.ConflictError
		mb *http.MaxBytesError
	)
	switch {
	case errors.As(err, &ve):
		return invalid(ve)
	case errors.As(err, &ce):
		p := statusProblem(http.StatusConflict, ce.Error())
		p.Type, p.Title = TypeConflict, "Version conflict"
		return p
	case errors.Is(err, policystore.ErrNotFound):
		return statusProblem(http.StatusNotFound, err.Error())
	case errors.As(err, &mb):
		return statusProblem(http.StatusRequestEntityTooLarge, "body larger than "+strconv.FormatInt(mb.Limit, 10)+" bytes")
	case errors.Is(err, r.Context().Err()) && r.Context().Err() != nil:
		return statusProblem(http.StatusServiceUnavailable, "request cancelled")
	}
	// Store errors can name hosts; they go to the log, not to the caller.
	s.log.Error("admin request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	return statusProblem(http.StatusServiceUnavailable, "policy store unavailable; see the server log")
}

// writeProblem sends p as application/problem+json.
func writeProblem(w http.ResponseWriter, r *http.Request, p *Problem) {
	p.Instance = r.URL.Path
	body, err := json.Marshal(p)
	if err != nil { // unreachable: strings and numbers only
		body = []byte(`{"type":"about:blank","status":500}`)
		p.Status = http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", problem.ContentType)
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n')) // the client went away; nothing to do
}

// writeJSON sends v with status code.
func writeJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		http.Error(w, "encode response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(body, '\n'))
}
