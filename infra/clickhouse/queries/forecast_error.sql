-- question: How good are the demand forecasts? Per model, region and horizon: forecast error against what came, beside persistence (the demand when the forecast was made).
-- parameters: window_s UInt32 = 86400
-- answer: one row per (model, region, horizon_s) with forecasts scored in the window: how many, MAE and sMAPE of ours and of persistence, MASE (ours over persistence), how often the actual fell inside the band, and the candidate chosen most
SELECT
    f.model AS model,
    f.region AS region,
    f.horizon_s AS horizon_s,
    count() AS scored,
    round(avg(abs(f.point_rps - a.observed_rps)), 3) AS mae_rps,
    round(avg(abs(f.observed_rps - a.observed_rps)), 3) AS mae_persistence_rps,
    round(avg(abs(f.point_rps - a.observed_rps))
          / greatest(avg(abs(f.observed_rps - a.observed_rps)), 1e-9), 3) AS mase,
    round(100 * avg(if(f.point_rps + a.observed_rps > 0,
        2 * abs(f.point_rps - a.observed_rps) / (f.point_rps + a.observed_rps), 0)), 2) AS smape,
    round(avg(a.observed_rps BETWEEN f.low_rps AND f.high_rps), 3) AS in_band_ratio,
    topK(1)(f.chosen)[1] AS chosen_most
FROM ${database}.forecasts AS f
INNER JOIN (
    SELECT model, region, made_at, any(observed_rps) AS observed_rps
    FROM ${database}.forecasts GROUP BY model, region, made_at
) AS a ON a.model = f.model AND a.region = f.region AND a.made_at = f.target_at
WHERE f.made_at >= (SELECT max(made_at) FROM ${database}.forecasts)
    - toIntervalSecond({window_s:UInt32})
GROUP BY f.model, f.region, f.horizon_s
ORDER BY model, region, horizon_s
