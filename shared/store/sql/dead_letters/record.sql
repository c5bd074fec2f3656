-- Records a message a consumer gave up on, at most once per (consumer, stream sequence).
-- $1: Uuid::now_v7()
-- $2: letter.consumer
-- $3: letter.subject
-- $4: letter.stream_sequence as i64
-- $5: letter.delivered
-- $6: letter.reason
-- $7: letter.payload
INSERT INTO dead_letters (id, consumer, subject, stream_sequence, delivered, reason, payload)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (consumer, stream_sequence) DO NOTHING
