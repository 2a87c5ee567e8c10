package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"

	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/policy"
)

// PolicyList is the answer of GET /v1/policies.
type PolicyList struct {
	Policies []policy.Policy `json:"policies"`
}

// History is the answer of GET /v1/policies/{id}/history.
type History struct {
	ID       string                `json:"id"`
	Versions []policystore.Version `json:"versions"`
}

// ValidateResult is the answer of a successful dry run.
type ValidateResult struct {
	Valid bool `json:"valid"`
	// Policies is the number of policies of the resulting set.
	Policies int `json:"policies"`
	// Warnings are what validates but probably does not do what was
	// meant (policy.Warnings of the resulting set); never a failure.
	Warnings []FieldError `json:"warnings,omitempty"`
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	ps, err := s.store.List(r.Context())
	if err != nil {
		writeProblem(w, r, s.fromError(r, err))
		return
	}
	if ps == nil {
		ps = []policy.Policy{}
	}
	writeJSON(w, http.StatusOK, PolicyList{Policies: ps})
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !validID(id) {
		writeProblem(w, r, statusProblem(http.StatusNotFound, fmt.Sprintf("no policy %q", id)))
		return
	}
	p, err := s.store.Get(r.Context(), id)
	if err != nil {
		writeProblem(w, r, s.fromError(r, err))
		return
	}
	w.Header().Set("ETag", etag(p.Version))
	writeJSON(w, http.StatusOK, p)
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	p, prob := readPolicy(w, r)
	if prob != nil {
		writeProblem(w, r, prob)
		return
	}
	if p.Version != 0 {
		writeProblem(w, r, badRequest("a new policy has no version yet; the store sets it",
			FieldError{Policy: p.ID, Field: "version", Message: "must be omitted on create"}))
		return
	}
	s.store1(w, r, p, policystore.NotExist, http.StatusCreated)
}

func (s *Server) put(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	p, prob := readPolicy(w, r)
	if prob != nil {
		writeProblem(w, r, prob)
		return
	}
	if p.ID == "" {
		p.ID = id
	}
	if p.ID != id {
		writeProblem(w, r, badRequest(fmt.Sprintf("the body's id %q is not the path's %q", p.ID, id),
			FieldError{Policy: p.ID, Field: "id", Message: "must match the path"}))
		return
	}
	expect, prob := expectedVersion(r, p.Version)
	if prob != nil {
		writeProblem(w, r, prob)
		return
	}
	s.store1(w, r, p, expect, http.StatusOK)
}

// store1 validates the set that writing p produces, then writes p.
func (s *Server) store1(w http.ResponseWriter, r *http.Request, p policy.Policy, expect int64, code int) {
	p.Version = 0
	err := s.check(r.Context(), func(f *policy.File) { upsert(f, p) }, touches(p.ID))
	if err == nil {
		p, err = s.store.Put(r.Context(), p, expect)
	}
	if err != nil {
		writeProblem(w, r, s.fromError(r, err))
		return
	}
	s.log.Info("policy written", "id", p.ID, "version", p.Version, "store", s.store.String())
	w.Header().Set("ETag", etag(p.Version))
	if code == http.StatusCreated {
		w.Header().Set("Location", "/v1/policies/"+p.ID)
	}
	writeJSON(w, code, p)
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !validID(id) {
		writeProblem(w, r, statusProblem(http.StatusNotFound, fmt.Sprintf("no policy %q", id)))
		return
	}
	expect, prob := expectedVersion(r, 0)
	if prob != nil {
		writeProblem(w, r, prob)
		return
	}
	// No whole-set check: removing a policy cannot make the others invalid
	// (only duplicate ids relate policies), and refusing it because some
	// other policy is bad would block the clean-up.
	if err := s.store.Delete(r.Context(), id, expect); err != nil {
		writeProblem(w, r, s.fromError(r, err))
		return
	}
	s.log.Info("policy deleted", "id", id, "store", s.store.String())
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) history(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !validID(id) {
		writeProblem(w, r, statusProblem(http.StatusNotFound, fmt.Sprintf("no policy %q", id)))
		return
	}
	vs, err := s.store.History(r.Context(), id)
	if err != nil {
		writeProblem(w, r, s.fromError(r, err))
		return
	}
	writeJSON(w, http.StatusOK, History{ID: id, Versions: vs})
}

func (s *Server) settings(w http.ResponseWriter, r *http.Request) {
	st, err := s.store.Settings(r.Context())
	if err != nil {
		writeProblem(w, r, s.fromError(r, err))
		return
	}
	w.Header().Set("ETag", etag(st.Version))
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) putSettings(w http.ResponseWriter, r *http.Request) {
	var st policystore.Settings
	if prob := readJSON(w, r, MaxPolicyBody, &st); prob != nil {
		writeProblem(w, r, prob)
		return
	}
	expect, prob := expectedVersion(r, st.Version)
	if prob != nil {
		writeProblem(w, r, prob)
		return
	}
	err := s.check(r.Context(), func(f *policy.File) { setSettings(f, st) }, touchesSettings)
	if err == nil {
		st, err = s.store.PutSettings(r.Context(), st, expect)
	}
	if err != nil {
		writeProblem(w, r, s.fromError(r, err))
		return
	}
	w.Header().Set("ETag", etag(st.Version))
	writeJSON(w, http.StatusOK, st)
}

// validate is the dry run: the body is one policy (validated as a PUT of
// it would be) or a whole file (validated as applying it would be: its
// policies upserted, its settings replacing the store's if it has any).
func (s *Server) validate(w http.ResponseWriter, r *http.Request) {
	change, touched, prob := readChange(w, r)
	if prob != nil {
		writeProblem(w, r, prob)
		return
	}
	var result *policy.File
	err := s.check(r.Context(), func(f *policy.File) { change(f); result = f }, touched)
	if err != nil {
		writeProblem(w, r, s.fromError(r, err))
		return
	}
	res := ValidateResult{Valid: true, Policies: len(result.Policies)}
	for _, p := range policy.Warnings(result) {
		res.Warnings = append(res.Warnings, FieldError{Policy: p.Policy, Field: p.Field, Message: p.Msg})
	}
	writeJSON(w, http.StatusOK, res)
}

// readChange decodes a dry run's body into the change it describes.
func readChange(w http.ResponseWriter, r *http.Request) (func(*policy.File), func(policy.Problem) bool, *Problem) {
	var raw json.RawMessage
	if prob := readJSON(w, r, MaxFileBody, &raw); prob != nil {
		return nil, nil, prob
	}
	return DecodeChange(raw)
}

// DecodeChange decodes a JSON policy or policy file into the change that
// applying it makes, and which stored problems it replaces. It is the
// dry run's decoder, exported for fuzzing and for allotctl's local checks.
func DecodeChange(data []byte) (change func(*policy.File), touched func(policy.Problem) bool, prob *Problem) {
	if isFile(data) {
		var f policy.File
		if prob := decodeJSON(data, &f); prob != nil {
			return nil, nil, prob
		}
		return func(into *policy.File) { ApplyFile(into, &f) }, touchesFile(&f), nil
	}
	var p policy.Policy
	if prob := decodeJSON(data, &p); prob != nil {
		return nil, nil, prob
	}
	p.Version = 0
	return func(f *policy.File) { upsert(f, p) }, touches(p.ID), nil
}

// isFile tells a whole file from one policy by its top-level members.
func isFile(data []byte) bool {
	var top map[string]json.RawMessage
	if json.Unmarshal(data, &top) != nil {
		return false // decodeJSON will say what is wrong
	}
	return IsFileKeys(func(k string) bool { _, ok := top[k]; return ok })
}

// IsFileKeys tells a whole file from one policy by its top-level members
// (has reports whether one is present). "lease" alone is ambiguous, as a
// policy has a lease block too: it makes a file only without an "id",
// which every policy needs. allotctl shares the rule for its YAML input.
func IsFileKeys(has func(key string) bool) bool {
	for _, k := range []string{"policies", "tenants", "default_tier", "costs", "rebalance"} {
		if has(k) {
			return true
		}
	}
	return has("lease") && !has("id")
}

// ApplyFile applies src to dst as allotctl apply -f does: src's policies
// are created or replaced, and its settings replace dst's if src has any.
func ApplyFile(dst, src *policy.File) {
	if HasSettings(src) {
		setSettings(dst, policystore.SettingsOf(src))
	}
	// One index of dst's ids, not a scan per policy: a dry run of a
	// 100,000-policy file was quadratic (54 s of CPU) here.
	at := make(map[string]int, len(dst.Policies)+len(src.Policies))
	for i, p := range dst.Policies {
		if _, dup := at[p.ID]; !dup {
			at[p.ID] = i
		}
	}
	for _, p := range src.Policies {
		p.Version = 0
		if i, ok := at[p.ID]; ok && p.ID != "" {
			dst.Policies[i] = p
			continue
		}
		at[p.ID] = len(dst.Policies)
		dst.Policies = append(dst.Policies, p)
	}
}

// HasSettings reports whether f sets any file-level setting.
func HasSettings(f *policy.File) bool {
	return len(f.Tenants) > 0 || f.DefaultTier != "" || len(f.Costs) > 0 || f.Rebalance != nil || f.Lease != nil
}

func setSettings(f *policy.File, st policystore.Settings) { st.ApplyTo(f) }

func upsert(f *policy.File, p policy.Policy) {
	if i := slices.IndexFunc(f.Policies, func(q policy.Policy) bool { return q.ID == p.ID }); i >= 0 && p.ID != "" {
		f.Policies[i] = p
		return
	}
	f.Policies = append(f.Policies, p)
}

// touches selects the stored problems that writing policy id replaces.
func touches(id string) func(policy.Problem) bool {
	return func(p policy.Problem) bool { return p.Policy == id }
}

func touchesSettings(p policy.Problem) bool { return p.Policy == "" && p.Field == "settings" }

func touchesFile(f *policy.File) func(policy.Problem) bool {
	ids := map[string]bool{}
	for _, p := range f.Policies {
		ids[p.ID] = true
	}
	settings := HasSettings(f)
	return func(p policy.Problem) bool { return ids[p.Policy] || (settings && touchesSettings(p)) }
}

// check validates the set that change makes of the store's current set.
// Problems the store already has are reported too (the set must be valid
// as a whole), except those of the entries the change replaces.
func (s *Server) check(ctx context.Context, change func(*policy.File), replaced func(policy.Problem) bool) error {
	f, _, err := s.store.Load(ctx)
	if f == nil {
		return err
	}
	var problems []policy.Problem
	var ve *policy.ValidationError
	if errors.As(err, &ve) {
		for _, p := range ve.Problems {
			if !replaced(p) {
				problems = append(problems, p)
			}
		}
	}
	change(f)
	if err := policy.Validate(s.store.String(), f); err != nil {
		if !errors.As(err, &ve) {
			return err
		}
		problems = append(problems, ve.Problems...)
	}
	if len(problems) > 0 {
		return &policy.ValidationError{Source: s.store.String(), Problems: problems}
	}
	return nil
}

// readPolicy decodes a POST or PUT body.
func readPolicy(w http.ResponseWriter, r *http.Request) (policy.Policy, *Problem) {
	var p policy.Policy
	prob := readJSON(w, r, MaxPolicyBody, &p)
	return p, prob
}

// readJSON checks the content type and size and decodes one JSON value.
func readJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) *Problem {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return statusProblem(http.StatusUnsupportedMediaType, "send application/json")
		}
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return statusProblem(http.StatusRequestEntityTooLarge, fmt.Sprintf("body larger than %d bytes", mb.Limit))
		}
		return badRequest("reading the body: " + err.Error())
	}
	return decodeJSON(data, v)
}

// decodeJSON decodes exactly one JSON value, rejecting unknown fields (a
// misspelt field would be a limit silently not enforced) and trailing data.
func decodeJSON(data []byte, v any) *Problem {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("trailing data after the JSON value")
		}
	}
	if err == nil {
		return nil
	}
	var (
		syn *json.SyntaxError
		typ *json.UnmarshalTypeError
	)
	fe := FieldError{Message: err.Error()}
	switch {
	case errors.Is(err, io.EOF):
		fe.Message = "empty body: want a JSON object"
	case errors.As(err, &syn):
		fe.Message = fmt.Sprintf("not JSON: %v (at byte %d)", syn, syn.Offset)
	case errors.As(err, &typ):
		fe.Field, fe.Message = typ.Field, fmt.Sprintf("want %s, got JSON %s", typ.Type, typ.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		fe.Field = strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		fe.Message = "unknown field"
	}
	return badRequest("the body does not decode", fe)
}
