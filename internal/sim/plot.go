package sim

import "errors"

// WritePNG draws the hottest key's admissions against the ideal.
func (r *Result) WritePNG(path string) error { return errors.New("sim: plot not implemented yet") }
