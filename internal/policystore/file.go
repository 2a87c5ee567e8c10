package policystore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/allot-dev/allot/policy"
)

// DefaultFilePoll is how often the file source looks at the file's size,
// modification time and inode.
const DefaultFilePoll = 200 * time.Millisecond

// historyKeep is how many versions of each policy a file source's history
// keeps (the NATS bucket keeps as many).
const historyKeep = 64

// FileSource keeps the set in one YAML or JSON policy file. Operators may
// edit the file by hand; watchers see the change within PollInterval.
// Writes through the source rewrite the file atomically (write a temporary
// file, fsync, rename), as YAML unless the name ends in .json, so comments
// and layout of a hand-written file do not survive a write.
//
// Versions live in the file (each policy's version field); the history and
// the settings version live beside it in PATH.history.json, which only
// writes through the source update.
type FileSource struct {
	path string
	poll time.Duration
	log  *slog.Logger
	mu   sync.Mutex // serialises this process's writes
}

// OpenFile opens the policy file at path, which must exist (an empty file
// is an empty set).
func OpenFile(path string, opts Options) (*FileSource, error) {
	if path == "" {
		return nil, errors.New("file store: empty path")
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("file store: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("file store: %w", notRegular(path, fi.Mode()))
	}
	poll := opts.PollInterval
	if poll <= 0 {
		poll = DefaultFilePoll
	}
	return &FileSource{path: path, poll: poll, log: opts.logger()}, nil
}

// String is the file's path: validation errors name it as their source.
func (s *FileSource) String() string { return s.path }

// Close does nothing: the source holds no open file between calls.
func (s *FileSource) Close() error { return nil }

// read returns the file's bytes and parsed content. A file that does not
// parse is returned as a *policy.ValidationError with an empty file.
func (s *FileSource) read() ([]byte, *policy.File, error) {
	data, err := readRegular(s.path)
	if err != nil {
		return nil, nil, fmt.Errorf("read policies: %w", err)
	}
	f, err := policy.Parse(s.path, data)
	if err != nil {
		return data, &policy.File{}, problemsErr(s.path, []policy.Problem{{Field: "file", Msg: err.Error()}})
	}
	return data, f, nil
}

// readRegular reads path if it is a regular file and refuses anything
// else. Reading a FIFO (--store <(generator)) or a device blocked the
// watcher, and every admin call on the source, for ever. The file is opened
// non-blocking, so opening a FIFO returns at once, and checked with fstat
// on the open descriptor, so it cannot be swapped after the check.
func readRegular(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, notRegular(path, fi.Mode())
	}
	return io.ReadAll(f)
}

func notRegular(path string, m fs.FileMode) error {
	return fmt.Errorf("%s is not a regular file (%s): a policy file must be a plain file, since a FIFO or device would block its reader; write the policies to a file and point --store at it", path, m.Type())
}

func hashRev(data []byte) Rev {
	h := fnv.New64a()
	h.Write(data)
	return Rev(h.Sum64())
}

// Load reads and parses the file.
func (s *FileSource) Load(context.Context) (*policy.File, Rev, error) {
	data, f, err := s.read()
	if data == nil {
		return nil, 0, err
	}
	return f, hashRev(data), err
}

// fileID is what tells the watcher the file may have changed.
type fileID struct {
	size  int64
	mtime time.Time
	ino   uint64
}

func statID(path string) (fileID, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileID{}, err
	}
	id := fileID{size: fi.Size(), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.ino = uint64(st.Ino)
	}
	return id, nil
}

// Watch polls the file's size, modification time and inode (an atomic
// rename changes the inode even within one mtime tick) and delivers the
// file when its content hash changed, once it has been stable for one
// poll interval. A change is delivered within two intervals. After the
// first delivery an empty (0-byte) file is ignored as a write in progress.
//
// On Linux a file changed in place (same inode) is applied only once a
// writer has closed it (inotify IN_CLOSE_WRITE): a writer that pauses
// mid-file, at a policy boundary, had its prefix applied, dropping the
// policies still to come. A file replaced by a rename (or a symlink swap,
// as Kubernetes ConfigMaps do) is complete by construction and applied
// once stable. Elsewhere, or if inotify is unavailable, stability alone
// decides.
func (s *FileSource) Watch(ctx context.Context, fn func(Snapshot)) error {
	var (
		last, settling fileID
		lastRev        Rev
		first          = true
		missing        bool
		closed         bool // a writer closed the file since the last read
		waiting        bool // logged that a change waits for its writer
	)
	cw := newCloseWatch(s.path)
	if cw != nil {
		defer cw.close()
	}
	t := time.NewTicker(s.poll)
	defer t.Stop()
	for {
		if cw != nil && cw.closed() {
			closed = true
		}
		id, err := statID(s.path)
		switch {
		case err != nil:
			// Editors that save by rename leave the path missing briefly.
			if !missing {
				s.log.Warn("policy file unreadable; keeping the last set", "path", s.path, "err", err)
			}
			missing = true
		case id == last:
			closed = false // whatever was closed is what was read
		case id != settling:
			// Changed: read it on the next tick if it stays the same, so a
			// writer that truncates and then writes (an editor, a shell
			// redirect) is not caught half-way, with an empty set.
			missing, settling = false, id
		case cw != nil && !first && id.ino == last.ino && !closed:
			// Changed in place and still open for writing: wait.
			if !waiting {
				s.log.Info("policy file changed but its writer has not closed it; waiting (replace the file by rename to apply at once)", "path", s.path)
			}
			waiting = true
		default:
			if cw != nil && id.ino != last.ino {
				cw.rewatch(s.path) // before reading: a close from now on is seen
			}
			missing, last, closed, waiting = false, id, false, false
			data, f, err := s.read()
			if data == nil {
				s.log.Warn("policy file unreadable; keeping the last set", "path", s.path, "err", err)
				last = fileID{} // try again on the next tick
				break
			}
			if len(data) == 0 && !first {
				// Most likely a writer between truncating and writing; an
				// operator who means "no policies" writes "policies: []".
				s.log.Warn("policy file is empty; keeping the last set (write \"policies: []\" to remove every policy)", "path", s.path)
				break
			}
			if rev := hashRev(data); first || rev != lastRev {
				first, lastRev = false, rev
				fn(Snapshot{File: f, Rev: rev, Problems: problemsOf(err)})
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// problemsOf returns the problems of a *policy.ValidationError.
func problemsOf(err error) []policy.Problem {
	var ve *policy.ValidationError
	if errors.As(err, &ve) {
		return ve.Problems
	}
	return nil
}

// List returns the file's policies ordered by id.
func (s *FileSource) List(context.Context) ([]policy.Policy, error) {
	_, f, err := s.read()
	if err != nil {
		return nil, err
	}
	ps := slices.Clone(f.Policies)
	slices.SortFunc(ps, func(a, b policy.Policy) int { return strings.Compare(a.ID, b.ID) })
	return ps, nil
}

// Get returns one policy of the file.
func (s *FileSource) Get(_ context.Context, id string) (policy.Policy, error) {
	_, f, err := s.read()
	if err != nil {
		return policy.Policy{}, err
	}
	if i := indexOf(f, id); i >= 0 {
		return f.Policies[i], nil
	}
	return policy.Policy{}, notFound(id)
}

func indexOf(f *policy.File, id string) int {
	return slices.IndexFunc(f.Policies, func(p policy.Policy) bool { return p.ID == id })
}

// Put replaces or appends p (keeping the file's order) and rewrites the file.
func (s *FileSource) Put(_ context.Context, p policy.Policy, expect int64) (policy.Policy, error) {
	var out policy.Policy
	err := s.update(func(f *policy.File, h *fileHistory) error {
		i := indexOf(f, p.ID)
		var cur int64
		if i >= 0 {
			cur = f.Policies[i].Version
		}
		if err := checkVersion(p.ID, expect, cur); err != nil {
			return err
		}
		p.Version = max(cur, h.latest(p.ID)) + 1
		if i >= 0 {
			f.Policies[i] = p
		} else {
			f.Policies = append(f.Policies, p)
		}
		h.add(p.ID, Version{Version: p.Version, Policy: &p, Time: time.Now().UTC()})
		out = p
		return nil
	})
	return out, err
}

// Delete removes a policy from the file.
func (s *FileSource) Delete(_ context.Context, id string, expect int64) error {
	return s.update(func(f *policy.File, h *fileHistory) error {
		i := indexOf(f, id)
		if i < 0 {
			return notFound(id)
		}
		cur := f.Policies[i].Version
		if err := checkVersion(id, expect, cur); err != nil {
			return err
		}
		f.Policies = slices.Delete(f.Policies, i, i+1)
		h.add(id, Version{Version: max(cur, h.latest(id)) + 1, Deleted: true, Time: time.Now().UTC()})
		return nil
	})
}

// History returns the versions written through the source; a policy only
// ever edited by hand has just its current version.
func (s *FileSource) History(ctx context.Context, id string) ([]Version, error) {
	h, err := s.readHistory()
	if err != nil {
		return nil, err
	}
	vs := slices.Clone(h.Policies[id])
	slices.Reverse(vs)
	if cur, err := s.Get(ctx, id); err == nil && (len(vs) == 0 || vs[0].Deleted || vs[0].Version != cur.Version) {
		// Edited by hand since the last write through the source.
		vs = append([]Version{{Version: cur.Version, Policy: &cur}}, vs...)
	}
	if len(vs) == 0 {
		return nil, notFound(id)
	}
	return vs, nil
}

// Settings returns the file's settings; the version comes from the history file.
func (s *FileSource) Settings(context.Context) (Settings, error) {
	_, f, err := s.read()
	if err != nil {
		return Settings{}, err
	}
	h, err := s.readHistory()
	if err != nil {
		return Settings{}, err
	}
	st := SettingsOf(f)
	st.Version = h.SettingsVersion
	return st, nil
}

// PutSettings replaces the file's settings.
func (s *FileSource) PutSettings(_ context.Context, st Settings, expect int64) (Settings, error) {
	err := s.update(func(f *policy.File, h *fileHistory) error {
		if err := checkVersion("", expect, h.SettingsVersion); err != nil {
			return err
		}
		h.SettingsVersion++
		st.Version = h.SettingsVersion
		st.ApplyTo(f)
		return nil
	})
	return st, err
}

// fileHistory is the sidecar file PATH.history.json.
type fileHistory struct {
	SettingsVersion int64                `json:"settings_version"`
	Policies        map[string][]Version `json:"policies"` // oldest first
}

func (h *fileHistory) latest(id string) int64 {
	if vs := h.Policies[id]; len(vs) > 0 {
		return vs[len(vs)-1].Version
	}
	return 0
}

func (h *fileHistory) add(id string, v Version) {
	vs := append(h.Policies[id], v)
	if len(vs) > historyKeep {
		vs = vs[len(vs)-historyKeep:]
	}
	h.Policies[id] = vs
}

func (s *FileSource) historyPath() string { return s.path + ".history.json" }

func (s *FileSource) readHistory() (*fileHistory, error) {
	h := &fileHistory{Policies: map[string][]Version{}}
	data, err := os.ReadFile(s.historyPath())
	if errors.Is(err, fs.ErrNotExist) {
		return h, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read policy history: %w", err)
	}
	if err := json.Unmarshal(data, h); err != nil {
		return nil, fmt.Errorf("%s: %w", s.historyPath(), err)
	}
	if h.Policies == nil {
		h.Policies = map[string][]Version{}
	}
	return h, nil
}

// update applies change to the file and its history and writes both. A
// file that does not parse is not rewritten: fixing it is an operator's
// job, and a rewrite would lose whatever they were typing.
func (s *FileSource) update(change func(*policy.File, *fileHistory) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, f, err := s.read()
	if err != nil {
		return err
	}
	h, err := s.readHistory()
	if err != nil {
		return err
	}
	if err := change(f, h); err != nil {
		return err
	}
	data, err := encodeFile(s.path, f)
	if err != nil {
		return err
	}
	hist, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("encode policy history: %w", err)
	}
	// History first: a crash between the two leaves a history entry for a
	// write that did not happen, never a write without its history.
	if err := writeAtomic(s.historyPath(), hist); err != nil {
		return err
	}
	return writeAtomic(s.path, data)
}

// writeAtomic replaces path with data so readers see the old or the new
// content, never a mix.
func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	mode := os.FileMode(0o644)
	if fi, err := os.Stat(path); err == nil {
		mode = fi.Mode().Perm()
	}
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(mode)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

const fileHeader = "Written by allot's policy store (admin API). Hand edits are fine;\nthe next write through the store drops comments and layout."

// encodeFile renders f as JSON for a .json path, else as YAML.
func encodeFile(path string, f *policy.File) ([]byte, error) {
	js, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode policies: %w", err)
	}
	if strings.EqualFold(filepath.Ext(path), ".json") {
		return append(js, '\n'), nil
	}
	return jsonToYAML(js, fileHeader)
}
