"""Reads of the history rollups for the portal's charts and tables. Every read is one indexed, aggregating query
(the database buckets and sums; Python only shapes the answer), so a 30-day page of a 1,000-node cluster reads
kilobytes, not the millions of rows behind it.

One module per concern: the windows and their buckets (`windows`), capacity by GPU model and the queue
(`capacity`), nodes, their GPUs and the heatmaps (`nodes`), a job's cards over its life (`jobs`), a team's figures (`teams`), queue times (`waits`),
GPU-hours (`usage`).
"""
