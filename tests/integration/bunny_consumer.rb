# bunny_consumer.rb HOST PORT QUEUE RUNS EFFECTS
#
# A Ruby worker with Bunny (Debian's ruby-bunny), for test_amqp_identity.py: consumes QUEUE with
# manual acks until RUNS deliveries were handled, naming each message's handler by its `type`
# property.  `charge` appends the message id to EFFECTS on every run (not idempotent);
# `charge_safe` appends it only the first time it sees the id (idempotent).  Exits 0 once RUNS
# deliveries were handled, 1 if that took over 60 s.
require "bunny"

host, port, queue, runs, effects = ARGV
runs = Integer(runs)
conn = Bunny.new(host: host, port: Integer(port), automatically_recover: false, heartbeat: 0)
conn.start
ch = conn.create_channel
ch.prefetch(1)
q = ch.queue(queue, durable: false, passive: true)
seen = {}
done = 0
lock = Mutex.new

q.subscribe(manual_ack: true, block: false) do |delivery, props, _body|
  id = props.message_id
  effect = props.type == "charge" || (props.type == "charge_safe" && !seen[id])
  seen[id] = true
  File.open(effects, "a") { |f| f.write("#{id}\n") } if effect
  ch.ack(delivery.delivery_tag)
  lock.synchronize { done += 1 }
end

deadline = Time.now + 60
sleep 0.05 while lock.synchronize { done } < runs && Time.now < deadline
conn.close
exit(done >= runs ? 0 : 1)
