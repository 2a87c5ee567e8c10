//go:build !linux

package redisproc

import "os/exec"

func allowedCPUs() ([]int, error)                        { return nil, errNoAffinity }
func setProcessCPUs([]int) error                         { return errNoAffinity }
func processCPUs(int) ([]int, error)                     { return nil, errNoAffinity }
func startOn(cmd *exec.Cmd, _ []int) (pinErr, err error) { return errNoAffinity, cmd.Start() }
