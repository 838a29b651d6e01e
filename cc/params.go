package cc

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// paramSetters maps mlx5's parameter names to Params fields. Times take a
// Go duration ("300us") or a number of microseconds, as mlx5 gives them;
// rates take a number of Mb/s (as mlx5's rpg_*_rate) or a value with a unit
// ("5Mbps", "10Gbps"); dce_tcp_g and initial_alpha_value are in mlx5's
// units (1024ths: dce_tcp_g read as dce_tcp_g_reading says, "weight" or
// "gain", see GReading; initial_alpha_value as alpha*1024, 1023 for
// 1023/1024); rpg_byte_reset in rpg_byte_reset_unit bytes (see
// Params.ByteResetUnit). The rules that are not mlx5 settings take true or false
// under roce-emu's own names (alpha_on_tick, clamp_tgt_rate_after_byte_inc, stage_check_first,
// hyper_step_constant, hyper_without_byte_counter, monitor_ignores,
// cnp_per_port, cnp_at_window_end).
var paramSetters = map[string]func(p *Params, v string) error{
	"rpg_min_rate":               func(p *Params, v string) (err error) { p.MinRate, err = parseRate(v); return },
	"rpg_ai_rate":                func(p *Params, v string) (err error) { p.AIRate, err = parseRate(v); return },
	"rpg_hai_rate":               func(p *Params, v string) (err error) { p.HAIRate, err = parseRate(v); return },
	"rate_to_set_on_first_cnp":   func(p *Params, v string) (err error) { p.RateOnFirstCNP, err = parseRate(v); return },
	"rpg_time_reset":             func(p *Params, v string) (err error) { p.TimeReset, err = parseMicros(v); return },
	"dce_tcp_rtt":                func(p *Params, v string) (err error) { p.AlphaPeriod, err = parseMicros(v); return },
	"rate_reduce_monitor_period": func(p *Params, v string) (err error) { p.RateReduceMonitorPeriod, err = parseMicros(v); return },
	"min_time_between_cnps":      func(p *Params, v string) (err error) { p.MinTimeBetweenCNPs, err = parseMicros(v); return },
	"rpg_byte_reset": func(p *Params, v string) error {
		n, err := strconv.Atoi(v)
		if err == nil && (n < 0 || n > 1<<30) {
			err = fmt.Errorf("rpg_byte_reset is 0-%d", 1<<30)
		}
		p.RPGByteReset = n
		p.ByteReset = n * max(p.ByteResetUnit, 1)
		return err
	},
	"rpg_byte_reset_unit": func(p *Params, v string) error {
		n, err := strconv.Atoi(v)
		if err == nil && (n < 1 || n > 1<<20) {
			err = fmt.Errorf("the unit is 1-%d bytes", 1<<20)
		}
		if err != nil {
			return err
		}
		p.ByteResetUnit = n
		if p.RPGByteReset != 0 {
			p.ByteReset = p.RPGByteReset * n
		}
		return nil
	},
	"rpg_threshold":   func(p *Params, v string) (err error) { p.Threshold, err = strconv.Atoi(v); return },
	"rpg_min_dec_fac": func(p *Params, v string) (err error) { p.MinDecFac, err = strconv.ParseFloat(v, 64); return },
	"dce_tcp_g": func(p *Params, v string) error {
		n, err := strconv.Atoi(v)
		if err == nil && (n < 1 || n > 1023) {
			err = fmt.Errorf("dce_tcp_g is 1-1023")
		}
		p.DCETCPG = n
		p.G = p.GReading.gain(n)
		return err
	},
	"dce_tcp_g_reading": func(p *Params, v string) error {
		switch v {
		case "weight":
			p.GReading = GWeight
		case "gain":
			p.GReading = GGain
		default:
			return fmt.Errorf("the reading is weight (g = (1024-dce_tcp_g)/1024) or gain (g = dce_tcp_g/1024)")
		}
		if p.DCETCPG != 0 {
			p.G = p.GReading.gain(p.DCETCPG)
		}
		return nil
	},
	"initial_alpha_value": func(p *Params, v string) error {
		n, err := strconv.ParseFloat(v, 64)
		p.InitialAlpha = n / 1024
		return err
	},
	"clamp_tgt_rate": func(p *Params, v string) (err error) { p.ClampTargetRate, err = strconv.ParseBool(v); return },
	"clamp_tgt_rate_after_time_inc": func(p *Params, v string) (err error) {
		p.ClampTargetRateAfterTimeInc, err = strconv.ParseBool(v)
		return
	},
	"clamp_tgt_rate_after_byte_inc": func(p *Params, v string) (err error) {
		p.ClampTargetRateAfterByteInc, err = strconv.ParseBool(v)
		return
	},
	"alpha_on_tick":              func(p *Params, v string) (err error) { p.AlphaOnTick, err = strconv.ParseBool(v); return },
	"stage_check_first":          func(p *Params, v string) (err error) { p.StageCheckFirst, err = strconv.ParseBool(v); return },
	"hyper_step_constant":        func(p *Params, v string) (err error) { p.HyperStepConstant, err = strconv.ParseBool(v); return },
	"hyper_without_byte_counter": func(p *Params, v string) (err error) { p.HyperWithoutByteCounter, err = strconv.ParseBool(v); return },
	"monitor_ignores":            func(p *Params, v string) (err error) { p.MonitorIgnores, err = strconv.ParseBool(v); return },
	"cnp_per_port":               func(p *Params, v string) (err error) { p.CNPPerPort, err = strconv.ParseBool(v); return },
	"cnp_at_window_end":          func(p *Params, v string) (err error) { p.CNPAtWindowEnd, err = strconv.ParseBool(v); return },
	"cnp_dscp": func(p *Params, v string) error {
		n, err := strconv.ParseUint(v, 10, 8)
		if err == nil && n > 63 {
			err = fmt.Errorf("DSCP is 0-63")
		}
		p.CNPDSCP = uint8(n)
		return err
	},
}

// ParamNames lists the names Set accepts.
func ParamNames() []string {
	var names []string
	for n := range paramSetters {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Set changes one parameter by its mlx5 name, as "rpg_ai_rate=5" (see
// paramSetters for units). The parameters are not checked as a whole: call
// Check after the last Set.
func (p *Params) Set(assignment string) error {
	name, v, ok := strings.Cut(assignment, "=")
	if !ok {
		return fmt.Errorf("cc: %q is not NAME=VALUE", assignment)
	}
	set := paramSetters[strings.TrimSpace(name)]
	if set == nil {
		return fmt.Errorf("cc: unknown parameter %q (known: %s)", name, strings.Join(ParamNames(), ", "))
	}
	if err := set(p, strings.TrimSpace(v)); err != nil {
		return fmt.Errorf("cc: %s=%s: %v", name, v, err)
	}
	return nil
}

func parseMicros(v string) (time.Duration, error) {
	if d, err := time.ParseDuration(v); err == nil {
		return d, nil
	}
	n, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, fmt.Errorf("not a duration (300us) or a number of microseconds")
	}
	return time.Duration(n * float64(time.Microsecond)), nil
}

func parseRate(v string) (Rate, error) {
	l := strings.ToLower(v)
	for _, u := range []struct {
		s string
		r Rate
	}{{"gbps", Gbps}, {"gb/s", Gbps}, {"mbps", Mbps}, {"mb/s", Mbps}, {"kbps", 1e3}, {"bps", 1}} {
		if strings.HasSuffix(l, u.s) {
			n, err := strconv.ParseFloat(strings.TrimSuffix(l, u.s), 64)
			return Rate(n) * u.r, err
		}
	}
	n, err := strconv.ParseFloat(l, 64)
	if err != nil {
		return 0, fmt.Errorf("not a rate (a number of Mb/s, or 5Mbps, 10Gbps)")
	}
	return Rate(n) * Mbps, nil
}

// ParseRate reads a rate as "40Gbps", "100Mbps" or a bare number of Gb/s.
func ParseRate(v string) (Rate, error) {
	l := strings.ToLower(v)
	if n, err := strconv.ParseFloat(l, 64); err == nil {
		return Rate(n) * Gbps, nil
	}
	return parseRate(v)
}
