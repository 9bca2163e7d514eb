//! The statistics the sections share: median, mean, and a mean's 95 % interval.

/// The upper median (the middle value, the higher of the two for an even count); NaN for no
/// values, so an empty sample never reads as a measured zero.
pub(super) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub(super) fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// The mean of `v` and the half-width of its 95 % confidence interval (Student's t, the
/// trials being few); None for fewer than two values.
pub(super) fn interval95(v: &[f64]) -> Option<(f64, f64)> {
    // t at 0.975 for 1 to 9 degrees of freedom; past that, 2.2 is within 5 % of it.
    const T: [f64; 9] = [12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26];
    let n = v.len();
    if n < 2 {
        return None;
    }
    let m = mean(v);
    let var = v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1) as f64;
    let t = T.get(n - 2).copied().unwrap_or(2.2);
    Some((m, t * (var / n as f64).sqrt()))
}

#[cfg(test)]
mod tests {
    use super::{interval95, median};

    #[test]
    fn the_pairs_interval_widens_with_their_spread_and_needs_two() {
        assert_eq!(interval95(&[0.98]), None);
        let (m, h) = interval95(&[0.99, 1.01, 0.99, 1.01]).unwrap();
        assert!((m - 1.0).abs() < 1e-9);
        // s = 0.01155, n = 4, t(3) = 3.18: 3.18 × 0.01155 / 2.
        assert!((h - 0.01836).abs() < 1e-4, "{h}");
        let (_, wide) = interval95(&[0.9, 1.1, 0.9, 1.1]).unwrap();
        assert!(wide > 9.0 * h);
    }

    #[test]
    fn the_median_is_the_middle_and_nothing_is_not_zero() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 3.0);
        assert!(median(&mut []).is_nan());
    }
}
