-- Refreshes the planner's statistics after seeding history.
ANALYZE
