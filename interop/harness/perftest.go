package main

// perftestScenarios runs perftest in the guest against roce-emu's
// perftest-compatible mode. (Filled in with the perftest-compatible mode.)
func (h *harness) perftestScenarios() []scenario { return nil }
