package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/policy"
	"github.com/allot-dev/allot/problem"
)

// Client calls an admin API; allotctl and tests use it. Every error the
// server answers comes back as a *Problem.
type Client struct {
	base  string
	token string
	http  *http.Client
}

// NewClient returns a client of the admin API at base (http://host:port).
// A nil hc uses http.DefaultClient.
func NewClient(base, token string, hc *http.Client) *Client {
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{base: strings.TrimRight(base, "/"), token: token, http: hc}
}

// List returns every policy.
func (c *Client) List(ctx context.Context) ([]policy.Policy, error) {
	var out PolicyList
	err := c.do(ctx, http.MethodGet, "/v1/policies", nil, -1, &out)
	return out.Policies, err
}

// Get returns one policy.
func (c *Client) Get(ctx context.Context, id string) (policy.Policy, error) {
	var p policy.Policy
	err := c.do(ctx, http.MethodGet, "/v1/policies/"+url.PathEscape(id), nil, -1, &p)
	return p, err
}

// Create creates p; it fails with 409 if p.ID exists.
func (c *Client) Create(ctx context.Context, p policy.Policy) (policy.Policy, error) {
	var out policy.Policy
	err := c.do(ctx, http.MethodPost, "/v1/policies", p, -1, &out)
	return out, err
}

// Put creates or replaces p; expect is a version or policystore.AnyVersion.
func (c *Client) Put(ctx context.Context, p policy.Policy, expect int64) (policy.Policy, error) {
	var out policy.Policy
	p.Version = 0
	err := c.do(ctx, http.MethodPut, "/v1/policies/"+url.PathEscape(p.ID), p, expect, &out)
	return out, err
}

// Delete deletes a policy; expect is a version or policystore.AnyVersion.
func (c *Client) Delete(ctx context.Context, id string, expect int64) error {
	return c.do(ctx, http.MethodDelete, "/v1/policies/"+url.PathEscape(id), nil, expect, nil)
}

// History returns a policy's versions, newest first.
func (c *Client) History(ctx context.Context, id string) ([]policystore.Version, error) {
	var out History
	err := c.do(ctx, http.MethodGet, "/v1/policies/"+url.PathEscape(id)+"/history", nil, -1, &out)
	return out.Versions, err
}

// Validate dry-runs body: a policy.Policy or a *policy.File.
func (c *Client) Validate(ctx context.Context, body any) (ValidateResult, error) {
	var out ValidateResult
	err := c.do(ctx, http.MethodPost, "/v1/policies:validate", body, -1, &out)
	return out, err
}

// Settings returns the settings document.
func (c *Client) Settings(ctx context.Context) (policystore.Settings, error) {
	var out policystore.Settings
	err := c.do(ctx, http.MethodGet, "/v1/settings", nil, -1, &out)
	return out, err
}

// PutSettings replaces the settings document.
func (c *Client) PutSettings(ctx context.Context, s policystore.Settings, expect int64) (policystore.Settings, error) {
	var out policystore.Settings
	s.Version = 0
	err := c.do(ctx, http.MethodPut, "/v1/settings", s, expect, &out)
	return out, err
}

func (c *Client) do(ctx context.Context, method, path string, body any, expect int64, out any) error {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if expect > 0 {
		req.Header.Set("If-Match", `"`+strconv.FormatInt(expect, 10)+`"`)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxFileBody))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		return problemOf(resp, data)
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// problemOf reads an error answer; one that is not a problem document
// (a proxy's HTML page, say) becomes a Problem carrying its text.
func problemOf(resp *http.Response, data []byte) *Problem {
	var p Problem
	if json.Unmarshal(data, &p) == nil && p.Status != 0 {
		return &p
	}
	p = Problem{Details: *problem.Status(resp.StatusCode, strings.TrimSpace(string(data)))}
	return &p
}
