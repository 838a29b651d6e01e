package main

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strings"

	"github.com/roce-emu/roce-emu/pcap/analyze"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// plotPoints is how many PSN-over-time points a connection keeps for its
// picture (analyze.Config.Points).
const plotPoints = 20000

var (
	colSend   = color.RGBA{R: 0x33, G: 0x66, B: 0xCC, A: 0xFF}
	colResend = color.RGBA{R: 0xDD, G: 0x22, B: 0x22, A: 0xFF}
	colNAK    = color.RGBA{R: 0x11, G: 0x99, B: 0x33, A: 0xFF}
)

// writeConnPlot draws connection c in two panels: its PSNs over time (first
// sends, resends and NAKs told apart) and its throughput per bin. The
// format follows name's extension: .svg or PNG.
func writeConnPlot(name string, c *analyze.Connection) error {
	psn := plot.New()
	psn.Title.Text = fmt.Sprintf("%s %s -> %s", c.Transport, c.Requester, c.Responder)
	psn.X.Label.Text = "time (ms)"
	psn.Y.Label.Text = "PSN - first PSN"
	psn.Add(plotter.NewGrid())
	series := [3]plotter.XYs{}
	for _, p := range c.Points {
		series[p.Kind] = append(series[p.Kind], plotter.XY{X: p.Us / 1e3, Y: float64(p.PSN)})
	}
	for k, s := range []struct {
		name  string
		col   color.Color
		shape draw.GlyphDrawer
	}{{"sent", colSend, draw.CircleGlyph{}}, {"resent", colResend, draw.CircleGlyph{}}, {"NAK", colNAK, draw.CrossGlyph{}}} {
		if len(series[k]) == 0 {
			continue
		}
		sc, err := plotter.NewScatter(series[k])
		if err != nil {
			return err
		}
		sc.GlyphStyle.Color = s.col
		sc.GlyphStyle.Shape = s.shape
		sc.GlyphStyle.Radius = vg.Points(1.5)
		if k == int(analyze.PointNAK) {
			sc.GlyphStyle.Radius = vg.Points(4)
		}
		psn.Add(sc)
		psn.Legend.Add(fmt.Sprintf("%s (%d)", s.name, len(series[k])), sc)
	}
	psn.Legend.Top = true
	psn.Legend.Left = true

	tput := plot.New()
	tput.X.Label.Text = "time (ms)"
	tput.Y.Label.Text = fmt.Sprintf("Gb/s per %.0f us", c.BinUs)
	tput.Add(plotter.NewGrid())
	xy := make(plotter.XYs, 0, 2*len(c.Throughput))
	for _, b := range c.Throughput {
		xy = append(xy, plotter.XY{X: b.StartUs / 1e3, Y: b.Gbps}, plotter.XY{X: (b.StartUs + c.BinUs) / 1e3, Y: b.Gbps})
	}
	if len(xy) > 0 {
		l, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		l.Color = colSend
		tput.Add(l)
	}
	return savePlots(name, [][]*plot.Plot{{psn}, {tput}}, 10*vg.Inch, 8*vg.Inch)
}

// ladderFrame is one frame of a ladder diagram.
type ladderFrame struct {
	frame    int
	us       float64
	src, dst string
	label    string
}

// writeLadder draws frames as arrows between the hosts' time lines, time
// running down, each arrow labelled with its frame, opcode and PSN.
func writeLadder(name, title string, frames []ladderFrame) error {
	if len(frames) == 0 {
		return fmt.Errorf("no RoCEv2 frame in the ladder's range")
	}
	var hosts []string
	col := map[string]float64{}
	for _, f := range frames {
		for _, h := range []string{f.src, f.dst} {
			if _, ok := col[h]; !ok {
				col[h] = float64(len(hosts))
				hosts = append(hosts, h)
			}
		}
	}
	p := plot.New()
	p.Title.Text = title
	p.HideAxes() // time runs down; each arrow is labelled with its frame and time
	n := float64(len(frames))
	for _, h := range hosts {
		l, err := plotter.NewLine(plotter.XYs{{X: col[h], Y: 0.5}, {X: col[h], Y: -n - 0.5}})
		if err != nil {
			return err
		}
		l.Color = color.Gray{Y: 100}
		p.Add(l)
	}
	var labels plotter.XYLabels
	for i, f := range frames {
		y := -float64(i) - 0.3
		x0, x1 := col[f.src], col[f.dst]
		l, err := plotter.NewLine(plotter.XYs{{X: x0, Y: y}, {X: x1, Y: y - 0.4}})
		if err != nil {
			return err
		}
		l.Color = colSend
		if strings.Contains(f.label, "NAK") {
			l.Color = colNAK
		}
		p.Add(l)
		head, err := plotter.NewScatter(plotter.XYs{{X: x1, Y: y - 0.4}})
		if err != nil {
			return err
		}
		head.GlyphStyle.Shape = draw.TriangleGlyph{}
		head.GlyphStyle.Color = l.Color
		p.Add(head)
		labels.XYs = append(labels.XYs, plotter.XY{X: (x0 + x1) / 2, Y: y - 0.05})
		labels.Labels = append(labels.Labels, fmt.Sprintf("%d  %.1f us  %s", f.frame, f.us, f.label))
	}
	lb, err := plotter.NewLabels(labels)
	if err != nil {
		return err
	}
	for i := range lb.TextStyle {
		lb.TextStyle[i].XAlign = draw.XCenter
		lb.TextStyle[i].Font.Size = vg.Points(7)
	}
	p.Add(lb)
	var hl plotter.XYLabels
	for _, h := range hosts {
		hl.XYs = append(hl.XYs, plotter.XY{X: col[h], Y: 0.6})
		hl.Labels = append(hl.Labels, h)
	}
	hlab, err := plotter.NewLabels(hl)
	if err != nil {
		return err
	}
	for i := range hlab.TextStyle {
		hlab.TextStyle[i].XAlign = draw.XCenter
	}
	p.Add(hlab)
	p.X.Min, p.X.Max = -0.6, float64(len(hosts))-0.4
	h := vg.Length(2+0.35*n) * vg.Inch
	return savePlots(name, [][]*plot.Plot{{p}}, 8*vg.Inch, h)
}

// savePlots draws plots, one per row, as SVG or PNG by name's extension.
func savePlots(name string, plots [][]*plot.Plot, w, h vg.Length) error {
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6), PadX: vg.Points(6), PadY: vg.Points(12)}
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	var dc draw.Canvas
	var write func() error
	if strings.EqualFold(filepath.Ext(name), ".svg") {
		c := vgsvg.New(w, h)
		dc = draw.New(c)
		write = func() error { _, err := c.WriteTo(f); return err }
	} else {
		c := vgimg.New(w, h)
		dc = draw.New(c)
		dc.SetColor(color.White)
		dc.Fill(dc.Rectangle.Path())
		write = func() error { _, err := (vgimg.PngCanvas{Canvas: c}).WriteTo(f); return err }
	}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	if err := write(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
