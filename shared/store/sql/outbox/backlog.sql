-- How many rows wait to be published, and the age of the oldest.
SELECT count(*), extract(epoch FROM now() - min(created_at))::float8 FROM outbox WHERE published_at IS NULL
