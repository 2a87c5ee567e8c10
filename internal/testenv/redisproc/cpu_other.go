//go:build !linux

package redisproc

import (
	"errors"
	"os/exec"
)

// errNoAffinity is the error of the CPU affinity calls outside Linux.
var errNoAffinity = errors.New("CPU affinity is only set on Linux")

func allowedCPUs() ([]int, error)                        { return nil, errNoAffinity }
func setProcessCPUs([]int) error                         { return errNoAffinity }
func processCPUs(int) ([]int, error)                     { return nil, errNoAffinity }
func startOn(cmd *exec.Cmd, _ []int) (pinErr, err error) { return errNoAffinity, cmd.Start() }
