package loadgen

import (
	"fmt"
	"image/color"
	"io"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// WritePNG draws the time series as a PNG: on top, admitted per second by
// region, in total and by the ideal limit; below, admitted and ideal
// summed since the start (where an overshoot or a shortfall accumulates).
func (r *Report) WritePNG(w io.Writer) error {
	if len(r.Series) == 0 {
		return fmt.Errorf("plot: no data: the run sent nothing")
	}
	rate, err := r.ratePlot()
	if err != nil {
		return err
	}
	cum, err := r.cumulativePlot()
	if err != nil {
		return err
	}
	img := vgimg.New(10*vg.Inch, 8*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(8), PadY: vg.Points(12)}
	plots := [][]*plot.Plot{{rate}, {cum}}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w); err != nil {
		return fmt.Errorf("write png: %w", err)
	}
	return nil
}

// series is one named line.
type series struct {
	name   string
	xys    plotter.XYs
	dashed bool
	color  color.Color
}

func (r *Report) ratePlot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("admitted per second (%s, %s)", r.Mode(), r.Keys)
	p.X.Label.Text = "seconds since start"
	p.Y.Label.Text = "admitted / s"
	step := r.Interval.Seconds()
	var lines []series
	for g, rr := range r.Regions {
		s := series{name: rr.Region, color: plotutil.Color(g)}
		for _, pt := range r.Series {
			s.xys = append(s.xys, plotter.XY{X: pt.Offset.Seconds(), Y: float64(pt.Regions[g].Admitted()) / step})
		}
		lines = append(lines, s)
	}
	total := series{name: "total", color: color.Black}
	ideal := series{name: "ideal", color: color.RGBA{R: 200, A: 255}, dashed: true}
	for _, pt := range r.Series {
		total.xys = append(total.xys, plotter.XY{X: pt.Offset.Seconds(), Y: float64(pt.Total.Admitted()) / step})
		ideal.xys = append(ideal.xys, plotter.XY{X: pt.Offset.Seconds(), Y: float64(pt.IdealAdmitted) / step})
	}
	if len(r.Regions) > 1 {
		lines = append(lines, total)
	}
	if r.Ideal != nil {
		lines = append(lines, ideal)
	}
	return p, addLines(p, lines)
}

func (r *Report) cumulativePlot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "admitted since start"
	p.X.Label.Text = "seconds since start"
	p.Y.Label.Text = "requests admitted"
	admitted := series{name: "admitted", color: color.Black}
	ideal := series{name: "ideal", color: color.RGBA{R: 200, A: 255}, dashed: true}
	var a, i float64
	step := r.Interval.Seconds()
	admitted.xys = append(admitted.xys, plotter.XY{})
	ideal.xys = append(ideal.xys, plotter.XY{})
	for _, pt := range r.Series {
		a += float64(pt.Total.Admitted())
		i += float64(pt.IdealAdmitted)
		// Cumulative counts belong at the end of their interval.
		x := pt.Offset.Seconds() + step
		admitted.xys = append(admitted.xys, plotter.XY{X: x, Y: a})
		ideal.xys = append(ideal.xys, plotter.XY{X: x, Y: i})
	}
	lines := []series{admitted}
	if r.Ideal != nil {
		lines = append(lines, ideal)
	}
	return p, addLines(p, lines)
}

func addLines(p *plot.Plot, lines []series) error {
	for _, s := range lines {
		l, err := plotter.NewLine(s.xys)
		if err != nil {
			return fmt.Errorf("plot %s: %w", s.name, err)
		}
		l.Color = s.color
		l.Width = vg.Points(1.5)
		if s.dashed {
			l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		}
		p.Add(l)
		p.Legend.Add(s.name, l)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(8)
	p.Add(plotter.NewGrid())
	// Headroom above the lines for the legend.
	p.Y.Min = 0
	p.Y.Max *= 1.25
	return nil
}
