//! A rectangular 2-D table with bilinear interpolation, clamped at its edges.

/// Which edge of an axis a query fell outside of, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clamp {
    Inside,
    Below,
    Above,
}

/// One axis lookup: the lower index, the interpolation fraction and the clamp.
#[derive(Debug, Clone, Copy)]
struct AxisPos {
    index: usize,
    frac: f64,
    clamp: Clamp,
}

/// `values[i * y.len() + j]` is the value at `(x[i], y[j])`. Axes are strictly
/// increasing (checked by the loader before a grid is built).
#[derive(Debug, Clone, PartialEq)]
pub struct Grid2 {
    x: Vec<f64>,
    y: Vec<f64>,
    values: Vec<f64>,
}

/// The result of a query: the value and whether each coordinate was clamped.
#[derive(Debug, Clone, Copy)]
pub struct Lookup {
    pub value: f64,
    pub x_clamp: Clamp,
    pub y_clamp: Clamp,
}

impl Grid2 {
    /// `rows[i][j]` is the value at `(x[i], y[j])`.
    pub fn new(x: Vec<f64>, y: Vec<f64>, rows: &[Vec<f64>]) -> Self {
        debug_assert_eq!(rows.len(), x.len());
        let values = rows.iter().flat_map(|row| row.iter().copied()).collect();
        Self { x, y, values }
    }

    pub fn x(&self) -> &[f64] {
        &self.x
    }

    pub fn y(&self) -> &[f64] {
        &self.y
    }

    pub fn at(&self, x: f64, y: f64) -> Lookup {
        let px = locate(&self.x, x);
        let py = locate(&self.y, y);
        let ny = self.y.len();
        let v = |i: usize, j: usize| self.values[i * ny + j];
        let i1 = (px.index + 1).min(self.x.len() - 1);
        let j1 = (py.index + 1).min(ny - 1);
        let low = v(px.index, py.index) * (1.0 - py.frac) + v(px.index, j1) * py.frac;
        let high = v(i1, py.index) * (1.0 - py.frac) + v(i1, j1) * py.frac;
        Lookup {
            value: low * (1.0 - px.frac) + high * px.frac,
            x_clamp: px.clamp,
            y_clamp: py.clamp,
        }
    }
}

fn locate(axis: &[f64], q: f64) -> AxisPos {
    let last = axis.len() - 1;
    if q <= axis[0] {
        let clamp = if q < axis[0] { Clamp::Below } else { Clamp::Inside };
        return AxisPos {
            index: 0,
            frac: 0.0,
            clamp,
        };
    }
    if q >= axis[last] {
        let clamp = if q > axis[last] { Clamp::Above } else { Clamp::Inside };
        return AxisPos {
            index: last,
            frac: 0.0,
            clamp,
        };
    }
    // First index whose value is > q; q lies in [axis[i-1], axis[i]).
    let upper = axis.partition_point(|&a| a <= q);
    let index = upper - 1;
    let frac = (q - axis[index]) / (axis[upper] - axis[index]);
    AxisPos {
        index,
        frac,
        clamp: Clamp::Inside,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> Grid2 {
        Grid2::new(vec![1.0, 3.0], vec![10.0, 20.0, 40.0], &[vec![1.0, 2.0, 4.0], vec![3.0, 4.0, 6.0]])
    }

    #[test]
    fn hits_grid_points_exactly() {
        let g = grid();
        assert_eq!(g.at(1.0, 10.0).value, 1.0);
        assert_eq!(g.at(3.0, 40.0).value, 6.0);
        assert_eq!(g.at(3.0, 20.0).value, 4.0);
    }

    #[test]
    fn interpolates_bilinearly() {
        let g = grid();
        // Halfway in x between rows (1,2) and (3,4) at y = 15: (1.5 + 3.5) / 2.
        assert!((g.at(2.0, 15.0).value - 2.5).abs() < 1e-12);
        assert!((g.at(1.0, 30.0).value - 3.0).abs() < 1e-12);
    }

    #[test]
    fn clamps_outside_and_reports_it() {
        let g = grid();
        let below = g.at(0.5, 5.0);
        assert_eq!(below.value, 1.0);
        assert_eq!(below.x_clamp, Clamp::Below);
        assert_eq!(below.y_clamp, Clamp::Below);
        let above = g.at(9.0, 100.0);
        assert_eq!(above.value, 6.0);
        assert_eq!(above.x_clamp, Clamp::Above);
        assert_eq!(above.y_clamp, Clamp::Above);
    }
}
