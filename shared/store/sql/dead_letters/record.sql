-- Records a message a consumer gave up on, at most once per (consumer, stream sequence).
-- $1 id: uuid — Uuid::now_v7()
-- $2 consumer: text
-- $3 subject: text
-- $4 stream_sequence: int8 — letter.stream_sequence as i64
-- $5 delivered: int8
-- $6 reason: text
-- $7 payload: bytea
INSERT INTO dead_letters (id, consumer, subject, stream_sequence, delivered, reason, payload)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (consumer, stream_sequence) DO NOTHING
