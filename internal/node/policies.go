package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/allot-dev/allot/internal/admin"
	"github.com/allot-dev/allot/internal/policystore"
	"github.com/allot-dev/allot/policy"
)

// policySource is where a node's policies come from: the store, the
// reloader that keeps the decider on its latest valid set, and the
// optional admin API over the same store.
type policySource struct {
	store    policystore.Source // nil: no store, the empty set forever
	reloader *policystore.Reloader
	admin    *admin.Server
	adminLis net.Listener
	log      *slog.Logger

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// StoreURL is the policy store a config names: StoreURL itself, or
// file:PoliciesPath, or "" for none.
func (c *Config) storeURL() (string, error) {
	switch {
	case c.StoreURL != "" && c.PoliciesPath != "":
		return "", errors.New("set the policy store or the policy file, not both (a store URL or a policy file path)")
	case c.StoreURL != "":
		return c.StoreURL, nil
	case c.PoliciesPath != "":
		return "file:" + c.PoliciesPath, nil
	}
	return "", nil
}

// openPolicies opens the store, compiles its set (a bad set fails the
// start, naming every problem) and listens on the admin address. Nothing
// runs until run.
func openPolicies(ctx context.Context, cfg *Config, log *slog.Logger) (*policySource, *policy.Set, error) {
	url, err := cfg.storeURL()
	if err != nil {
		return nil, nil, err
	}
	ps := &policySource{log: log}
	if url == "" {
		if cfg.AdminAddr != "" {
			return nil, nil, errors.New("the admin API needs a policy store (--store URL)")
		}
		set, err := policy.Compile("(no policy store)", &policy.File{})
		return ps, set, err
	}
	if cfg.AdminAddr != "" {
		if err := admin.CheckAddr(cfg.AdminAddr, cfg.AdminToken); err != nil {
			return nil, nil, err
		}
	}
	ps.store, err = policystore.Open(ctx, url, policystore.Options{Logger: log, NATS: cfg.Transport.NATS})
	if err != nil {
		return nil, nil, err
	}
	ps.reloader = policystore.NewReloader(ps.store, log)
	set, err := ps.reloader.Load(ctx)
	if err != nil {
		return nil, nil, errors.Join(err, ps.store.Close())
	}
	if cfg.AdminAddr != "" {
		ps.admin = admin.New(admin.Config{Store: ps.store, Token: cfg.AdminToken, Logger: log})
		if ps.adminLis, err = net.Listen("tcp", cfg.AdminAddr); err != nil {
			return nil, nil, errors.Join(fmt.Errorf("admin API: listen on %s: %w", cfg.AdminAddr, err), ps.store.Close())
		}
		ps.adminLis = cfg.Transport.listener(ps.adminLis)
	}
	return ps, set, nil
}

// run starts the reloader and the admin API; close stops them.
func (ps *policySource) run(target policystore.Target) {
	if ps.store == nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	ps.cancel = cancel
	ps.wg.Go(func() {
		if err := ps.reloader.Run(ctx, target); err != nil {
			ps.log.Error("policy reloader stopped", "err", err)
		}
	})
	if ps.admin != nil {
		ps.log.Info("admin API serving", "addr", ps.adminLis.Addr().String(), "store", ps.store.String())
		ps.wg.Go(func() {
			if err := ps.admin.Serve(ctx, ps.adminLis); err != nil {
				ps.log.Error("admin API stopped", "err", err)
			}
		})
	}
}

// close stops the reloader and the admin API, then closes the store.
func (ps *policySource) close() error {
	if ps.store == nil {
		return nil
	}
	if ps.cancel != nil {
		ps.cancel()
	} else if ps.adminLis != nil {
		ps.adminLis.Close() // never served
	}
	ps.wg.Wait()
	return ps.store.Close()
}

// AdminAddr is the admin API's listen address, or "" without one.
func (n *Node) AdminAddr() string {
	if n.policies == nil || n.policies.adminLis == nil {
		return ""
	}
	return n.policies.adminLis.Addr().String()
}

// PolicyStatus says what the policy reloader last did: the revision in
// force and the last rejected one with its problems.
func (n *Node) PolicyStatus() policystore.Status {
	if n.policies == nil || n.policies.reloader == nil {
		return policystore.Status{}
	}
	return n.policies.reloader.Status()
}
