"""The embedded demo: its cluster, teams, people, jobs and past (`load_demo`), and the one command that serves it
with the scheduling loop and simulated agents (`run_demo`). Nothing else imports it."""
