package main

import (
	"encoding/csv"
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/roce-emu/roce-emu/cc"
	"github.com/roce-emu/roce-emu/cc/sim"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

func runDCQCN(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("dcqcn", flag.ContinueOnError)
	fs.SetOutput(stderr)
	flows := fs.Int("flows", 8, "number of senders in the N-to-1 incast")
	link := fs.String("link-rate", "40", "link and bottleneck `rate` (Gb/s, or 25Gbps, 100Mbps)")
	dur := fs.Duration("duration", 50*time.Millisecond, "simulated `time`")
	profile := fs.String("profile", cc.ProfilePaper, "DCQCN parameter `profile`: paper, mlx5 or hpcc")
	var params multiFlag
	fs.Var(&params, "param", "set one parameter by its mlx5 name, NAME=VALUE (repeatable), e.g. rpg_ai_rate=10 or rpg_time_reset=55us; names: "+strings.Join(cc.ParamNames(), ", "))
	ccName := fs.String("cc", "dcqcn", "congestion control: dcqcn or none")
	q := cc.DefaultQueue(0)
	queueFlags(fs, &q)
	mtu := fs.Int("mtu", 1024, "payload `bytes` per packet")
	delay := fs.Duration("delay", time.Microsecond, "one-way delay of each hop")
	sample := fs.Duration("sample", 0, "sampling interval of the CSV and plot (default duration/1000)")
	seed := fs.Uint64("seed", 1, "random `seed` of the marking and of the flows' start times")
	csvFile := fs.String("csv", "dcqcn.csv", "CSV `file` of time, queue depth, and each flow's rate and alpha (\"\" for none)")
	plotFile := fs.String("plot", "dcqcn.png", "plot `file`, .png or .svg (\"\" for none)")
	asJSON := fs.Bool("json", false, "print the summary as one JSON object")
	perPacket := fs.Bool("per-packet", false, "run every send and arrival as an event (slower; packets that reach the port in the same nanosecond are taken in another order, so figures may differ where they tie)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: roce-emu dcqcn [flags]")
		fmt.Fprintln(stderr, "\nRuns an N-to-1 incast through an emulated switch queue in simulated time: senders")
		fmt.Fprintln(stderr, "paced by DCQCN's reaction point, WRED-ECN marking, CNPs from the receiver's")
		fmt.Fprintln(stderr, "notification point. Writes rates, alpha and queue depth over time (CSV and plot)")
		fmt.Fprintln(stderr, "and prints throughput per flow, Jain's index, utilisation and queue percentiles")
		fmt.Fprintln(stderr, "over the last half of the run, and CE marks, CNPs, drops and PFC pauses counted")
		fmt.Fprintln(stderr, "over the whole run.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "roce-emu dcqcn: "+format+"\n", a...)
		return 2
	}
	if fs.NArg() != 0 {
		return fail("unexpected argument %q", fs.Arg(0))
	}
	rate, err := cc.ParseRate(*link)
	if err != nil || rate <= 0 {
		return fail("--link-rate %q: give Gb/s as a number, or a rate such as 25Gbps", *link)
	}
	q.LineRate = rate
	if err := q.Check(); err != nil {
		return fail("%v", err)
	}
	if *ccName != "dcqcn" && *ccName != "none" {
		return fail("--cc %q: dcqcn or none", *ccName)
	}
	p, err := dcqcnParams(*profile, rate, params)
	if err != nil {
		return fail("%v", err)
	}
	if *dur <= 0 || *dur > 10*time.Second {
		return fail("--duration %v: must be positive and at most 10s", *dur)
	}
	if *plotFile != "" {
		if ext := strings.ToLower(filepath.Ext(*plotFile)); ext != ".png" && ext != ".svg" {
			return fail("--plot %q: the file must end in .png or .svg", *plotFile)
		}
	}
	start := time.Now()
	res, err := sim.Run(sim.Config{Flows: *flows, LinkRate: rate, Duration: *dur, MTU: *mtu, Delay: *delay, Queue: q,
		DCQCN: *ccName == "dcqcn", Params: p, Sample: *sample, Seed: *seed, PerPacket: *perPacket})
	if err != nil {
		return fail("%v", err)
	}
	if *csvFile != "" {
		if err := writeCSV(*csvFile, res); err != nil {
			fmt.Fprintf(stderr, "roce-emu dcqcn: %v\n", err)
			return 1
		}
	}
	if *plotFile != "" {
		title := fmt.Sprintf("%d:1 incast at %v, %s, Kmin %d Kmax %d Pmax %g", *flows, rate, *ccName, q.KMin, q.KMax, q.PMax)
		if *ccName == "dcqcn" {
			title = fmt.Sprintf("%d:1 incast at %v, DCQCN %s, Kmin %d Kmax %d Pmax %g", *flows, rate, *profile, q.KMin, q.KMax, q.PMax)
		}
		if err := writePlot(*plotFile, title, res, q); err != nil {
			fmt.Fprintf(stderr, "roce-emu dcqcn: %v\n", err)
			return 1
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.Encode(res)
		return 0
	}
	fmt.Fprintf(stdout, "%d:1 incast, %v links, %v simulated in %.2fs, congestion control %s", *flows, rate, *dur, time.Since(start).Seconds(), *ccName)
	if *ccName == "dcqcn" {
		fmt.Fprintf(stdout, " (profile %s)", *profile)
	}
	fmt.Fprintf(stdout, "\nswitch: WRED-ECN Kmin %d Kmax %d Pmax %g, buffer %d, PFC %v\n", q.KMin, q.KMax, q.PMax, q.Buffer, q.PFC)
	fmt.Fprintf(stdout, "over the last half:\n  per-flow throughput (Gb/s):")
	for _, g := range res.PerFlowGbps {
		fmt.Fprintf(stdout, " %.2f", g)
	}
	fmt.Fprintf(stdout, "\n  Jain's fairness index: %.4f\n  link utilisation: %.3f\n  queue depth: p50 %d B, p99 %d B, max %d B\n",
		res.JainIndex, res.Utilization, res.QueueP50, res.QueueP99, res.QueueMax)
	fmt.Fprintf(stdout, "whole run: %d packets marked CE, %d CNPs (%d ignored, %d folded into a pending cut by the reaction points), %d drops, %d PFC pauses\n",
		res.Marked, res.CNPs, res.CNPsIgnored, res.CNPsCoalesced, res.Drops, res.Pauses)
	if *csvFile != "" {
		fmt.Fprintf(stdout, "wrote %s", *csvFile)
		if *plotFile != "" {
			fmt.Fprintf(stdout, " and %s", *plotFile)
		}
		fmt.Fprintln(stdout)
	} else if *plotFile != "" {
		fmt.Fprintf(stdout, "wrote %s\n", *plotFile)
	}
	return 0
}

func writeCSV(name string, r *sim.Result) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	head := []string{"time_us", "queue_bytes"}
	if len(r.Samples) > 0 {
		for i := range r.Samples[0].Rates {
			head = append(head, fmt.Sprintf("rate_gbps_%d", i), fmt.Sprintf("alpha_%d", i))
		}
	}
	w.Write(head)
	for _, s := range r.Samples {
		row := []string{strconv.FormatFloat(float64(s.T)/1e3, 'f', 3, 64), strconv.Itoa(s.Queue)}
		for i := range s.Rates {
			row = append(row, strconv.FormatFloat(float64(s.Rates[i]/cc.Gbps), 'f', 4, 64), strconv.FormatFloat(s.Alpha[i], 'f', 5, 64))
		}
		w.Write(row)
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writePlot draws three panels: each flow's rate, each flow's alpha, and
// the queue depth with Kmin and Kmax.
func writePlot(name, title string, r *sim.Result, q cc.QueueConfig) error {
	n := 0
	if len(r.Samples) > 0 {
		n = len(r.Samples[0].Rates)
	}
	mk := func(ytitle string) *plot.Plot {
		p := plot.New()
		p.X.Label.Text = "time (ms)"
		p.Y.Label.Text = ytitle
		p.Add(plotter.NewGrid())
		return p
	}
	rates, alphas, queue := mk("rate (Gb/s)"), mk("alpha"), mk("queue (KB)")
	rates.Title.Text = title
	for i := 0; i < n; i++ {
		rx, ax := make(plotter.XYs, len(r.Samples)), make(plotter.XYs, len(r.Samples))
		for k, s := range r.Samples {
			t := float64(s.T) / 1e6
			rx[k] = plotter.XY{X: t, Y: float64(s.Rates[i] / cc.Gbps)}
			ax[k] = plotter.XY{X: t, Y: s.Alpha[i]}
		}
		for _, pp := range []struct {
			p  *plot.Plot
			xy plotter.XYs
		}{{rates, rx}, {alphas, ax}} {
			l, err := plotter.NewLine(pp.xy)
			if err != nil {
				return err
			}
			l.Color = plotutil.Color(i)
			pp.p.Add(l)
			if n <= 8 && pp.p == rates {
				rates.Legend.Add(fmt.Sprintf("flow %d", i), l)
			}
		}
	}
	rates.Legend.Top = true
	qx := make(plotter.XYs, len(r.Samples))
	for k, s := range r.Samples {
		qx[k] = plotter.XY{X: float64(s.T) / 1e6, Y: float64(s.Queue) / 1e3}
	}
	ql, err := plotter.NewLine(qx)
	if err != nil {
		return err
	}
	queue.Add(ql)
	for _, k := range []struct {
		v    int
		name string
	}{{q.KMin, "Kmin"}, {q.KMax, "Kmax"}} {
		if len(qx) == 0 {
			break
		}
		kl, _ := plotter.NewLine(plotter.XYs{{X: qx[0].X, Y: float64(k.v) / 1e3}, {X: qx[len(qx)-1].X, Y: float64(k.v) / 1e3}})
		kl.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
		kl.Color = color.Gray{Y: 120}
		queue.Add(kl)
		queue.Legend.Add(k.name, kl)
	}
	queue.Legend.Top = true

	w, h := 10*vg.Inch, 11*vg.Inch
	plots := [][]*plot.Plot{{rates}, {alphas}, {queue}}
	tiles := draw.Tiles{Rows: 3, Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6), PadX: vg.Points(6), PadY: vg.Points(12)}
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	if strings.EqualFold(filepath.Ext(name), ".svg") {
		c := vgsvg.New(w, h)
		canvases := plot.Align(plots, tiles, draw.New(c))
		for i := range plots {
			plots[i][0].Draw(canvases[i][0])
		}
		if _, err := c.WriteTo(f); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
	c := vgimg.New(w, h)
	dc := draw.New(c)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	if _, err := (vgimg.PngCanvas{Canvas: c}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
