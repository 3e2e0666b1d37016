//! Which GPU deviates from its peers. Robust to the outlier itself: the centre is the median and
//! the spread the median absolute deviation (MAD), so one bad card cannot drag the baseline.
//!
//! A card's metric is flagged when `|x − median| > max(OUTLIER_K × 1.4826 × MAD, floor)`, where
//! 1.4826 × MAD estimates the standard deviation for normal data, `OUTLIER_K` = 3.5 (the usual
//! modified-z-score cut-off), and `floor` = `OUTLIER_FLOOR` × max(|median|, 1) keeps identical,
//! idle or near-identical peers (MAD ≈ 0) from flagging noise. Needs at least 3 GPUs: with two
//! there is no majority to say which one is odd.

use inferscope_model::{
    quantile,
    thresholds::{OUTLIER_FLOOR, OUTLIER_K},
};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    quantile::median(v).unwrap_or(0.0)
}

/// For each value (None = not measured on that GPU), whether it is an outlier among the measured.
pub(crate) fn flag_outliers(values: &[Option<f64>]) -> Vec<bool> {
    let mut present: Vec<f64> = values.iter().flatten().copied().collect();
    if present.len() < 3 {
        return vec![false; values.len()];
    }
    let med = median(&mut present);
    let mut dev: Vec<f64> = present.iter().map(|x| (x - med).abs()).collect();
    let mad = median(&mut dev);
    let margin = (OUTLIER_K * 1.4826 * mad).max(OUTLIER_FLOOR * med.abs().max(1.0));
    values
        .iter()
        .map(|v| v.is_some_and(|x| (x - med).abs() > margin))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_the_odd_card_only() {
        let v = [
            Some(80.0),
            Some(82.0),
            Some(79.0),
            Some(81.0),
            Some(35.0),
            None,
        ];
        assert_eq!(
            flag_outliers(&v),
            vec![false, false, false, false, true, false]
        );
    }

    #[test]
    fn identical_or_few_cards_are_not_flagged() {
        assert_eq!(flag_outliers(&[Some(50.0); 4]), vec![false; 4]);
        assert_eq!(
            flag_outliers(&[Some(50.0), Some(51.0), Some(50.5), Some(53.0)]),
            vec![false; 4]
        );
        assert_eq!(flag_outliers(&[Some(10.0), Some(90.0)]), vec![false; 2]);
    }
}
